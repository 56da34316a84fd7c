//! (Feature `allocinfo`.)
#![cfg(feature = "allocinfo")]

use std::string::String;

use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounts};
use magpie_codetag::{CodeTag, CodeTagFlags};

use super::FailingSink;
use crate::reports::{
    AllocinfoError, AllocinfoFilter, AllocinfoOptions, AllocinfoRow, AllocinfoSort, allocinfo,
};

fn grow() -> &'static str {
    "magpie::shell::kmem::grow"
}
fn shrink() -> &'static str {
    "magpie::mm::shrink"
}

static TAGS: [AllocTag; 3] = [
    AllocTag {
        tag: CodeTag {
            module: "magpie::shell::kmem",
            file: "kernel/src/shell/kmem.rs",
            line: 122,
            flags: CodeTagFlags::NONE,
            function_path: grow,
        },
    },
    AllocTag {
        tag: CodeTag {
            module: "magpie::mm",
            file: "kernel/src/mm/paging.rs",
            line: 40,
            flags: CodeTagFlags::NONE,
            function_path: shrink,
        },
    },
    AllocTag {
        tag: CodeTag {
            module: "magpie::shell::kmem",
            file: "kernel/src/shell/kmem.rs",
            line: 173,
            flags: CodeTagFlags::NONE,
            function_path: shrink,
        },
    },
];

fn counts(tag: &AllocTag) -> AllocTagCounts {
    match tag.tag.line {
        122 => AllocTagCounts {
            bytes: 6144,
            calls: 48,
        },
        40 => AllocTagCounts {
            bytes: 8192,
            calls: 2,
        },
        _ => AllocTagCounts {
            bytes: 100,
            calls: 100,
        },
    }
}

fn run(options: &AllocinfoOptions<'_>) -> String {
    let mut rows = [AllocinfoRow::default(); 3];
    let mut text = String::new();
    allocinfo(&mut text, &TAGS, &counts, &mut rows, options).unwrap();
    text
}

#[test]
fn linux_layout_in_section_order_and_sorted() {
    assert_eq!(
        run(&AllocinfoOptions::default()),
        "allocinfo - version: 1.0\n\
         #     <size>  <calls> <tag info>\n\
         \x20       6144       48 kernel/src/shell/kmem.rs:122 func:grow\n\
         \x20       8192        2 kernel/src/mm/paging.rs:40 func:shrink\n\
         \x20        100      100 kernel/src/shell/kmem.rs:173 func:shrink\n"
    );
    let by_calls = run(&AllocinfoOptions {
        sort: AllocinfoSort::Calls,
        top: 1,
        ..AllocinfoOptions::default()
    });
    assert!(
        by_calls.ends_with(
            "<tag info>\n         100      100 kernel/src/shell/kmem.rs:173 func:shrink\n"
        )
    );
    let human = run(&AllocinfoOptions {
        sort: AllocinfoSort::Bytes,
        human: true,
        ..AllocinfoOptions::default()
    });
    assert!(
        human.contains("\n        8.0K        2 kernel/src/mm/paging.rs:40"),
        "{human}"
    );
}

#[test]
fn header_version_goes_with_the_accuracy_field() {
    let text = run(&AllocinfoOptions {
        inaccurate: true,
        ..AllocinfoOptions::default()
    });
    assert!(text.starts_with("allocinfo - version: 2.0\n"), "{text}");
    assert!(
        text.lines()
            .skip(2)
            .all(|line| line.ends_with(" accurate:no"))
    );
}

#[test]
fn filters_like_linux() {
    let none = AllocinfoFilter::default();
    // (filter, counts inaccurate, rows shown)
    let cases = [
        (none, false, 3),
        (
            AllocinfoFilter {
                function: Some("shrink"),
                ..none
            },
            false,
            2,
        ),
        (
            AllocinfoFilter {
                function: Some("shrin"),
                ..none
            },
            false,
            0,
        ),
        (
            AllocinfoFilter {
                file: Some("shell/"),
                ..none
            },
            false,
            2,
        ),
        (
            AllocinfoFilter {
                file: Some("kmem.rs"),
                line: Some(173),
                ..none
            },
            false,
            1,
        ),
        (
            AllocinfoFilter {
                min_bytes: Some(6144),
                ..none
            },
            false,
            2,
        ),
        (
            AllocinfoFilter {
                max_bytes: Some(6144),
                ..none
            },
            false,
            2,
        ),
        (
            AllocinfoFilter {
                min_bytes: Some(101),
                max_bytes: Some(8191),
                ..none
            },
            false,
            1,
        ),
        (
            AllocinfoFilter {
                accurate: Some(true),
                ..none
            },
            false,
            3,
        ),
        (
            AllocinfoFilter {
                accurate: Some(true),
                ..none
            },
            true,
            0,
        ),
        (
            AllocinfoFilter {
                accurate: Some(false),
                ..none
            },
            true,
            3,
        ),
    ];
    for (filter, inaccurate, nr_rows) in cases {
        let text = run(&AllocinfoOptions {
            filter,
            inaccurate,
            ..AllocinfoOptions::default()
        });
        assert_eq!(text.lines().count() - 2, nr_rows, "{filter:?}: {text}");
    }
}

#[test]
fn too_few_rows_and_a_failing_sink_are_errors() {
    let mut rows = [AllocinfoRow::default(); 2];
    let mut text = String::new();
    let error = allocinfo(
        &mut text,
        &TAGS,
        &counts,
        &mut rows,
        &AllocinfoOptions::default(),
    );
    assert_eq!(
        error,
        Err(AllocinfoError::TooManyTags {
            nr_tags: 3,
            capacity: 2
        })
    );
    assert!(text.is_empty());
    assert_eq!(
        std::format!("{}", error.unwrap_err()),
        "3 allocation tags, allocinfo shows at most 2"
    );
    let mut rows = [AllocinfoRow::default(); 3];
    let mut sink = FailingSink { budget: 40 };
    assert_eq!(
        allocinfo(
            &mut sink,
            &TAGS,
            &counts,
            &mut rows,
            &AllocinfoOptions::default()
        ),
        Err(AllocinfoError::Format)
    );
}
