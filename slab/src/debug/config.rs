//! Feature `debug`: the boot-line configuration of slab debugging
//! (`slab_debug=` after Linux, `kmem_flags=` after illumos): which debug
//! flags which caches get ([`SlabDebugConfig`], set with
//! [`SlabDebug::set_config`](super::SlabDebug::set_config)).

use core::fmt;

use super::{DebugFlags, LETTERS};

/// Longest cache name kept (as [`KmemCache::name`](crate::KmemCache::name)).
pub(crate) const DEBUG_NAME_MAX: usize = 31;
/// Cache names one `slab_debug=` block may list.
pub(crate) const DEBUG_MAX_CACHES: usize = 8;
/// `;`-separated blocks in one `slab_debug=`.
pub(crate) const DEBUG_MAX_RULES: usize = 4;

/// A cache name (or a `prefix*` pattern) of a `slab_debug=` block.
#[derive(Clone, Copy, PartialEq, Eq)]
struct NamePattern {
    bytes: [u8; DEBUG_NAME_MAX],
    len: u8,
}

impl NamePattern {
    const EMPTY: NamePattern = NamePattern {
        bytes: [0; DEBUG_NAME_MAX],
        len: 0,
    };

    fn new(name: &str) -> Result<NamePattern, SlabDebugError> {
        if name.len() > DEBUG_NAME_MAX {
            return Err(SlabDebugError::NameTooLong);
        }
        let mut pattern = NamePattern::EMPTY;
        pattern.bytes[..name.len()].copy_from_slice(name.as_bytes());
        pattern.len = name.len() as u8;
        Ok(pattern)
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Exact match, or a prefix match for a pattern ending in `*`.
    fn matches(&self, name: &str) -> bool {
        match self.as_bytes().split_last() {
            Some((b'*', prefix)) => name.as_bytes().starts_with(prefix),
            _ => self.as_bytes() == name.as_bytes(),
        }
    }
}

/// One `;`-separated block: flags, and the caches they apply to (none
/// listed: every cache).
#[derive(Clone, Copy)]
struct Rule {
    flags: DebugFlags,
    caches: [NamePattern; DEBUG_MAX_CACHES],
    nr_caches: u8,
}

impl Rule {
    const EMPTY: Rule = Rule {
        flags: DebugFlags::empty(),
        caches: [NamePattern::EMPTY; DEBUG_MAX_CACHES],
        nr_caches: 0,
    };

    fn caches(&self) -> &[NamePattern] {
        &self.caches[..self.nr_caches as usize]
    }
}

/// Why a `slab_debug=` or `kmem_flags=` value was refused. Nothing of a
/// refused value is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabDebugError {
    /// A letter that is not one of `F Z P U C -` (`T`, `A` and `O` exist in
    /// Linux but not here).
    UnknownLetter(char),
    /// A cache name longer than `DEBUG_NAME_MAX` (31) bytes.
    NameTooLong,
    /// More than `DEBUG_MAX_CACHES` (8) caches in one block.
    TooManyCaches,
    /// More than `DEBUG_MAX_RULES` (4) `;`-separated blocks.
    TooManyRules,
    /// A `kmem_flags=` value that is not a number (`0x` hex or decimal).
    BadNumber,
    /// `kmem_flags=` bits other than `KMF_AUDIT | KMF_DEADBEEF |
    /// KMF_REDZONE | KMF_CONTENTS` (0xf).
    UnsupportedBits(u32),
}

impl fmt::Display for SlabDebugError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SlabDebugError::UnknownLetter('T') => {
                f.write_str("slab_debug letter T (trace) is not supported; use kmemtrace")
            }
            SlabDebugError::UnknownLetter('A') => {
                f.write_str("slab_debug letter A (failslab) is not supported; use fault")
            }
            SlabDebugError::UnknownLetter(letter) => write!(
                f,
                "unknown slab_debug letter {letter:?} (known: F Z P U C, - for none)"
            ),
            SlabDebugError::NameTooLong => write!(
                f,
                "slab_debug cache name longer than {DEBUG_NAME_MAX} bytes"
            ),
            SlabDebugError::TooManyCaches => write!(
                f,
                "more than {DEBUG_MAX_CACHES} caches in one slab_debug block"
            ),
            SlabDebugError::TooManyRules => {
                write!(
                    f,
                    "more than {DEBUG_MAX_RULES} ';'-separated slab_debug blocks"
                )
            }
            SlabDebugError::BadNumber => {
                f.write_str("kmem_flags is not a number (0x hex or decimal)")
            }
            SlabDebugError::UnsupportedBits(bits) => write!(
                f,
                "kmem_flags bits {bits:#x} are not supported (known: 0x1 audit, 0x2 deadbeef, 0x4 redzone, 0x8 contents)"
            ),
        }
    }
}

/// Which caches get which debug flags, from the boot line.
///
/// Syntax (Linux `slab_debug`): `slab_debug` alone turns `FZPU` on for
/// every cache; `slab_debug=FLAGS[,CACHE…][;FLAGS,CACHE…]…` where `FLAGS`
/// are letters (case-insensitive; empty means `FZPU`, `-` means none):
/// `F` consistency checks, `Z` redzones, `P` poison, `U` audit (user
/// tracking), `C` contents (Magpie). A block without caches sets the
/// flags of every cache; a block with caches sets theirs (a name ending
/// in `*` matches a prefix), the last matching block wins. The word
/// `panic` anywhere in the list makes the kernel panic on a detected error
/// instead of reporting and going on (illumos `kmem_panic`).
///
/// `kmem_flags=0xN` (illumos, hex with `0x` or decimal) is an alias for
/// every cache: `0x1` audit, `0x2` poison (deadbeef), `0x4` redzone, `0x8`
/// contents; any of them also turns on the consistency checks.
#[derive(Clone, Copy)]
pub struct SlabDebugConfig {
    rules: [Rule; DEBUG_MAX_RULES],
    nr_rules: u8,
    /// Panic on a detected error (the kernel's policy; the allocator only
    /// reports).
    pub panic: bool,
}

impl Default for SlabDebugConfig {
    fn default() -> Self {
        SlabDebugConfig::NONE
    }
}

impl fmt::Debug for SlabDebugConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlabDebugConfig({self})")
    }
}

/// The configuration back in `slab_debug=` syntax (`-` when off).
impl fmt::Display for SlabDebugConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for rule in self.rules() {
            if !first {
                f.write_str(";")?;
            }
            first = false;
            write!(f, "{}", rule.flags.letters())?;
            for cache in rule.caches() {
                let name = core::str::from_utf8(cache.as_bytes()).unwrap_or("?");
                write!(f, ",{name}")?;
            }
        }
        if first {
            f.write_str("-")?;
        }
        if self.panic {
            f.write_str(",panic")?;
        }
        Ok(())
    }
}

impl SlabDebugConfig {
    /// No debugging (the default).
    pub const NONE: SlabDebugConfig = SlabDebugConfig {
        rules: [Rule::EMPTY; DEBUG_MAX_RULES],
        nr_rules: 0,
        panic: false,
    };

    fn rules(&self) -> &[Rule] {
        &self.rules[..self.nr_rules as usize]
    }

    /// The same flags for every cache.
    pub fn all(flags: DebugFlags) -> SlabDebugConfig {
        let mut config = SlabDebugConfig::NONE;
        config.rules[0].flags = flags;
        config.nr_rules = 1;
        config
    }

    /// Parse the value of `slab_debug` (`None`: the bare word, no `=`).
    ///
    /// # Errors
    /// See [`SlabDebugError`]; nothing is half-applied.
    pub fn parse_slab_debug(value: Option<&str>) -> Result<SlabDebugConfig, SlabDebugError> {
        let Some(value) = value else {
            return Ok(SlabDebugConfig::all(DebugFlags::DEFAULT));
        };
        let mut config = SlabDebugConfig::NONE;
        for block in value.split(';') {
            let mut tokens = block.split(',');
            let letters = tokens.next().unwrap_or("");
            if letters.eq_ignore_ascii_case("panic") {
                config.panic = true;
                if tokens.next().is_none() {
                    continue;
                }
                return Err(SlabDebugError::UnknownLetter('p'));
            }
            let mut rule = Rule::EMPTY;
            rule.flags = parse_letters(letters)?;
            for token in tokens {
                if token.is_empty() {
                    continue;
                }
                if token == "panic" {
                    config.panic = true;
                    continue;
                }
                if rule.nr_caches as usize == DEBUG_MAX_CACHES {
                    return Err(SlabDebugError::TooManyCaches);
                }
                rule.caches[rule.nr_caches as usize] = NamePattern::new(token)?;
                rule.nr_caches += 1;
            }
            if config.nr_rules as usize == DEBUG_MAX_RULES {
                return Err(SlabDebugError::TooManyRules);
            }
            config.rules[config.nr_rules as usize] = rule;
            config.nr_rules += 1;
        }
        Ok(config)
    }

    /// Parse the value of illumos `kmem_flags` (for every cache).
    ///
    /// # Errors
    /// [`SlabDebugError::BadNumber`], [`SlabDebugError::UnsupportedBits`].
    pub fn parse_kmem_flags(value: &str) -> Result<SlabDebugConfig, SlabDebugError> {
        let number = match value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
        {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => value.parse::<u32>(),
        }
        .map_err(|_| SlabDebugError::BadNumber)?;
        const KMF: [(u32, DebugFlags); 4] = [
            (0x1, DebugFlags::AUDIT),
            (0x2, DebugFlags::POISON),
            (0x4, DebugFlags::REDZONE),
            (0x8, DebugFlags::CONTENTS),
        ];
        let unsupported = number & !0xf;
        if unsupported != 0 {
            return Err(SlabDebugError::UnsupportedBits(unsupported));
        }
        let mut flags = DebugFlags::empty();
        for (bit, flag) in KMF {
            if number & bit != 0 {
                flags |= flag | DebugFlags::CONSISTENCY;
            }
        }
        Ok(SlabDebugConfig::all(flags))
    }

    /// The debug flags the cache named `name` gets.
    pub fn flags_for(&self, name: &str) -> DebugFlags {
        let mut global = DebugFlags::empty();
        let mut listed = None;
        for rule in self.rules() {
            if rule.caches().is_empty() {
                global = rule.flags;
            } else if rule.caches().iter().any(|cache| cache.matches(name)) {
                listed = Some(rule.flags);
            }
        }
        listed.unwrap_or(global)
    }

    /// Whether any cache gets any flag.
    pub fn is_enabled(&self) -> bool {
        self.rules().iter().any(|rule| !rule.flags.is_empty())
    }
}

fn parse_letters(letters: &str) -> Result<DebugFlags, SlabDebugError> {
    if letters.is_empty() {
        return Ok(DebugFlags::DEFAULT);
    }
    let mut flags = DebugFlags::empty();
    for letter in letters.chars() {
        if letter == '-' {
            flags = DebugFlags::empty();
            continue;
        }
        let upper = letter.to_ascii_uppercase();
        let Some(&(_, flag)) = LETTERS.iter().find(|(known, _)| *known == upper) else {
            return Err(SlabDebugError::UnknownLetter(upper));
        };
        flags |= flag;
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_parse_and_print() {
        let config = SlabDebugConfig::parse_slab_debug(Some("FZPU")).unwrap();
        assert_eq!(config.flags_for("kmalloc-64"), DebugFlags::DEFAULT);
        assert_eq!(std::format!("{config}"), "FZPU");
        let config = SlabDebugConfig::parse_slab_debug(Some("pz")).unwrap();
        assert_eq!(
            config.flags_for("x"),
            DebugFlags::POISON | DebugFlags::REDZONE
        );
        assert_eq!(std::format!("{}", config.flags_for("x").letters()), "ZP");
    }

    #[test]
    fn bare_slab_debug_is_fzpu_everywhere() {
        let config = SlabDebugConfig::parse_slab_debug(None).unwrap();
        assert_eq!(config.flags_for("dentry"), DebugFlags::DEFAULT);
        assert!(config.is_enabled());
        let config = SlabDebugConfig::parse_slab_debug(Some("")).unwrap();
        assert_eq!(config.flags_for("dentry"), DebugFlags::DEFAULT);
    }

    #[test]
    fn cache_lists_and_blocks() {
        let config =
            SlabDebugConfig::parse_slab_debug(Some("FZPU,kmalloc-64,inode*;P,dentry")).unwrap();
        assert_eq!(config.flags_for("kmalloc-64"), DebugFlags::DEFAULT);
        assert_eq!(config.flags_for("inode_cache"), DebugFlags::DEFAULT);
        assert_eq!(config.flags_for("dentry"), DebugFlags::POISON);
        assert_eq!(config.flags_for("kmalloc-128"), DebugFlags::empty());
        assert!(!config.panic);
        // A global block and an exception, as in Linux's documentation.
        let config = SlabDebugConfig::parse_slab_debug(Some("FZ;-,zs_handle")).unwrap();
        assert_eq!(
            config.flags_for("kmalloc-8"),
            DebugFlags::CONSISTENCY | DebugFlags::REDZONE
        );
        assert_eq!(config.flags_for("zs_handle"), DebugFlags::empty());
        assert_eq!(std::format!("{config}"), "FZ;-,zs_handle");
    }

    #[test]
    fn panic_option() {
        let config = SlabDebugConfig::parse_slab_debug(Some("FZPU,kmalloc-64,panic")).unwrap();
        assert!(config.panic);
        assert_eq!(config.flags_for("kmalloc-64"), DebugFlags::DEFAULT);
        assert_eq!(config.flags_for("panic"), DebugFlags::empty());
        let config = SlabDebugConfig::parse_slab_debug(Some("FZPU;panic")).unwrap();
        assert!(config.panic);
        assert_eq!(config.flags_for("any"), DebugFlags::DEFAULT);
    }

    #[test]
    fn bad_slab_debug_values_are_refused_clearly() {
        let parse = |value| SlabDebugConfig::parse_slab_debug(Some(value)).err();
        assert_eq!(parse("FZX"), Some(SlabDebugError::UnknownLetter('X')));
        assert_eq!(parse("T"), Some(SlabDebugError::UnknownLetter('T')));
        let long = "F,0123456789012345678901234567890123";
        assert_eq!(parse(long), Some(SlabDebugError::NameTooLong));
        assert_eq!(
            parse("F,a,b,c,d,e,f,g,h,i"),
            Some(SlabDebugError::TooManyCaches)
        );
        assert_eq!(parse("F;F;F;F;F"), Some(SlabDebugError::TooManyRules));
        let text = std::format!("{}", SlabDebugError::UnknownLetter('X'));
        assert!(text.contains("unknown slab_debug letter 'X'"), "{text}");
        let text = std::format!("{}", SlabDebugError::UnknownLetter('T'));
        assert!(text.contains("kmemtrace"), "{text}");
    }

    #[test]
    fn kmem_flags_alias() {
        let config = SlabDebugConfig::parse_kmem_flags("0xf").unwrap();
        assert_eq!(
            config.flags_for("kmalloc-64"),
            DebugFlags::DEFAULT | DebugFlags::CONTENTS
        );
        let config = SlabDebugConfig::parse_kmem_flags("2").unwrap();
        assert_eq!(
            config.flags_for("x"),
            DebugFlags::POISON | DebugFlags::CONSISTENCY
        );
        let config = SlabDebugConfig::parse_kmem_flags("0").unwrap();
        assert!(!config.is_enabled());
        assert_eq!(
            SlabDebugConfig::parse_kmem_flags("0x30").err(),
            Some(SlabDebugError::UnsupportedBits(0x30))
        );
        assert_eq!(
            SlabDebugConfig::parse_kmem_flags("0xzz").err(),
            Some(SlabDebugError::BadNumber)
        );
        assert_eq!(
            SlabDebugConfig::parse_kmem_flags("").err(),
            Some(SlabDebugError::BadNumber)
        );
    }
}
