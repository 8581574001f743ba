//! Allow lists (`UCS_CONFIG_TYPE_ALLOW_LIST`): select names such as transports or devices,
//! with a `^` prefix to deny instead, `all` for everything, and shell-style patterns.

use super::ConfigValue;

/// Which names a user selected: `all`, `a,b` (only these) or `^a,b` (all but these).
///
/// Entries are `fnmatch`-style patterns as in UCX (`mlx5_*`, `dev[0-3]`), matched
/// case-sensitively. As in UCX, `all` must be the only entry, and `^all` also means all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AllowList {
    /// Every name is allowed (`all`).
    All,
    /// Only names matching one of the patterns are allowed.
    Allow(Vec<String>),
    /// Every name except those matching one of the patterns is allowed (`^` prefix).
    Deny(Vec<String>),
}

impl AllowList {
    /// True when the list admits `name`.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            AllowList::All => true,
            AllowList::Allow(patterns) => patterns.iter().any(|p| glob_match(p, name)),
            AllowList::Deny(patterns) => !patterns.iter().any(|p| glob_match(p, name)),
        }
    }

    /// The explicitly listed patterns (empty for `All`).
    pub fn patterns(&self) -> &[String] {
        match self {
            AllowList::All => &[],
            AllowList::Allow(p) | AllowList::Deny(p) => p,
        }
    }
}

impl ConfigValue for AllowList {
    fn parse_value(s: &str) -> Result<Self, String> {
        let (negate, rest) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let items: Vec<String> = Vec::parse_value(rest)?;
        if items.first().map(String::as_str) == Some("all") {
            return if items.len() == 1 {
                Ok(AllowList::All)
            } else {
                Err(format!("\"all\" alone; {}", Self::syntax()))
            };
        }
        Ok(if negate { AllowList::Deny(items) } else { AllowList::Allow(items) })
    }

    fn format_value(&self) -> String {
        match self {
            AllowList::All => "all".to_string(),
            AllowList::Allow(items) => items.join(","),
            AllowList::Deny(items) => format!("^{}", items.join(",")),
        }
    }

    fn syntax() -> String {
        "comma-separated list (prepend '^' for negation, or set to \"all\" for including all \
         items) of: string"
            .to_string()
    }
}

/// Matches `name` against a shell pattern with `fnmatch(3)` semantics and no flags:
/// `*`, `?`, bracket expressions (`[a-c]`, `[!x]`, `[^x]`) and `\` escapes.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    // Position after the last `*` and the name position it currently covers up to; on a
    // mismatch the star absorbs one more character. Greedy single-star backtracking is
    // enough because a later star subsumes the choices of an earlier one.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi + 1, ni));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => match bracket(&p, pi + 1, n[ni]) {
                Some((true, next)) => Some(next),
                Some((false, _)) => None,
                // An unterminated bracket is an ordinary character.
                None => (n[ni] == '[').then_some(pi + 1),
            },
            Some('\\') if pi + 1 < p.len() => (p[pi + 1] == n[ni]).then_some(pi + 2),
            Some(&c) => (c == n[ni]).then_some(pi + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                ni += 1;
            }
            (None, Some((star_pi, star_ni))) => {
                pi = star_pi;
                ni = star_ni + 1;
                star = Some((star_pi, star_ni + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Evaluates the bracket expression starting at `p[start]` (just after `[`) against `c`.
/// Returns whether it matched and the index after the closing `]`, or `None` if unterminated.
fn bracket(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let lo = *p.get(i)?;
        if lo == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        let (lo, after_lo) = if lo == '\\' { (*p.get(i + 1)?, i + 2) } else { (lo, i + 1) };
        if p.get(after_lo) == Some(&'-') && p.get(after_lo + 1).is_some_and(|&h| h != ']') {
            let (hi, after_hi) = match p[after_lo + 1] {
                '\\' => (*p.get(after_lo + 2)?, after_lo + 3),
                h => (h, after_lo + 2),
            };
            matched |= lo <= c && c <= hi;
            i = after_hi;
        } else {
            matched |= lo == c;
            i = after_lo;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("mlx5_*", "mlx5_0"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b", "aXbc"));
        assert!(glob_match("dev[0-3]", "dev2"));
        assert!(!glob_match("dev[!0-3]", "dev2"));
        assert!(glob_match("dev[]]", "dev]"));
        assert!(glob_match("x[", "x["));
        assert!(glob_match("a\\*", "a*"));
        assert!(!glob_match("a\\*", "ab"));
        assert!(glob_match("?", "z"));
        assert!(!glob_match("?", ""));
    }

    #[test]
    fn allow_list_forms() {
        let p = |s| AllowList::parse_value(s);
        assert_eq!(p("all"), Ok(AllowList::All));
        assert_eq!(p("^all"), Ok(AllowList::All));
        assert!(p("all,a").is_err());
        assert_eq!(p("a,b"), Ok(AllowList::Allow(vec!["a".into(), "b".into()])));
        assert_eq!(p("^a,,b"), Ok(AllowList::Deny(vec!["a".into(), "b".into()])));
        assert_eq!(p("^"), Ok(AllowList::Deny(vec![])));
        assert_eq!(p(""), Ok(AllowList::Allow(vec![])));
        let deny = p("^posix,cma").unwrap();
        assert!(deny.allows("sysv") && !deny.allows("posix"));
    }
}
