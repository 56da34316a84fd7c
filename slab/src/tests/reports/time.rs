use crate::reports::Nanoseconds;

#[test]
fn one_form_with_the_unit() {
    let cases = [
        (0, "0 ns"),
        (999, "999 ns"),
        (1_000, "1.000 µs"),
        (12_345, "12.345 µs"),
        (508_583_108, "508.583 ms"),
        (3_250_000_000, "3.250 s"),
        (u64::MAX, "18446744073.709 s"),
    ];
    for (ns, text) in cases {
        assert_eq!(std::format!("{}", Nanoseconds(ns)), text);
    }
    assert_eq!(
        std::format!("[{:>12}]", Nanoseconds(1_500)),
        "[    1.500 µs]"
    );
    assert_eq!(std::format!("[{:<8}]", Nanoseconds(7)), "[7 ns    ]");
}
