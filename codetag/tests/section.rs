//! Host tests: tags land in their section, are walkable as a slice, and name
//! the function that contains them.

use magpie_codetag::{CodeTag, CodeTagFlags, TaggedWith, codetag_section};

/// A test application: a counter per tagged location.
pub struct Probe {
    tag: CodeTag,
}

impl TaggedWith for Probe {
    fn codetag(&self) -> &CodeTag {
        &self.tag
    }
}

codetag_section!(
    /// The probes of this test binary.
    pub static PROBES: [Probe]
);

/// Defines a probe at the call site and returns it.
macro_rules! probe {
    ($flags:expr) => {{
        #[magpie_codetag::linkme::distributed_slice($crate::PROBES)]
        #[linkme(crate = magpie_codetag::linkme)]
        static HERE: $crate::Probe = $crate::Probe {
            tag: magpie_codetag::codetag!($flags),
        };
        &HERE
    }};
}

fn first_site() -> &'static Probe {
    probe!(CodeTagFlags::NONE)
}

fn second_site() -> &'static Probe {
    let closure = || probe!(CodeTagFlags::EXPLICIT);
    closure()
}

mod nested {
    pub fn third_site() -> &'static super::Probe {
        probe!(magpie_codetag::CodeTagFlags::SCOPE)
    }
}

#[test]
fn every_tag_is_in_the_section() {
    let sites = [first_site(), second_site(), nested::third_site()];
    assert_eq!(
        PROBES.len(),
        3,
        "exactly the three probes defined in this file"
    );
    for site in sites {
        assert!(
            PROBES.iter().any(|p| core::ptr::eq(p, site)),
            "{} missing from the section",
            site.codetag()
        );
    }
}

#[test]
fn tags_name_the_enclosing_function_module_file_and_line() {
    let first = first_site().codetag();
    assert_eq!(first.function(), "first_site");
    assert_eq!(first.module, "section");
    assert!(first.file.ends_with("tests/section.rs"), "{}", first.file);
    assert_eq!(first.flags, CodeTagFlags::NONE);

    let second = second_site().codetag();
    assert_eq!(
        second.function(),
        "second_site",
        "closures count as their function"
    );
    assert!(second.flags.contains(CodeTagFlags::EXPLICIT));

    let third = nested::third_site().codetag();
    assert_eq!(third.function(), "third_site");
    assert_eq!(third.module, "section::nested");
    assert_ne!(first.line, third.line);
}

#[test]
fn location_matching_and_display() {
    let tag = first_site().codetag();
    let spec = format!("{}:{}", tag.file, tag.line);
    assert!(tag.matches_location(&spec));
    assert!(!tag.matches_location(&format!("{}:{}", tag.file, tag.line + 1)));
    assert!(!tag.matches_location("no-colon-here"));
    assert!(!tag.matches_location(&format!("{}:notanumber", tag.file)));
    assert_eq!(
        tag.to_string(),
        format!("{}:{} section func:first_site", tag.file, tag.line)
    );
}

#[test]
fn function_name_trimming() {
    use magpie_codetag::function_name_from_path as trim;
    assert_eq!(
        trim("magpie::shell::cmd_kmalloc::HERE::__codetag_fn::__codetag_marker"),
        "cmd_kmalloc"
    );
    assert_eq!(trim("a::b::{{closure}}::{{constant}}::X::__f"), "b");
    // The same site's function read from a core: a demangled v0 symbol
    // (magpie-kmem core CORE allocinfo printed `{closure#0}` here while
    // the shell printed `alloc`).
    assert_eq!(trim("<a::B>::alloc::{closure#0}::__codetag_fn"), "alloc");
    assert_eq!(trim("__only"), "?");
}
