//! Splitting the command line the way glibc `getopt` does.

/// One result of the getopt scan.
#[derive(Debug, PartialEq)]
pub(super) enum Item {
    Opt(char, Option<String>),
    Positional(String),
}

/// Splits `args` the way glibc `getopt` does with `optstring`: options may cluster and take
/// their argument attached or from the next word, non-options are collected in order
/// wherever they appear, `--` ends the options.
pub(super) fn getopt(args: &[String], optstring: &str) -> Result<Vec<Item>, String> {
    let spec = |c: char| -> Option<bool> {
        let i = optstring.find(c)?;
        Some(optstring[i + c.len_utf8()..].starts_with(':'))
    };
    let mut items = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            items.extend(args[i..].iter().cloned().map(Item::Positional));
            break;
        }
        let Some(cluster) = a.strip_prefix('-').filter(|c| !c.is_empty()) else {
            items.push(Item::Positional(a.clone()));
            continue;
        };
        for (pos, c) in cluster.char_indices() {
            if c == ':' {
                return Err(invalid_option(c));
            }
            match spec(c) {
                None => return Err(invalid_option(c)),
                Some(false) => items.push(Item::Opt(c, None)),
                Some(true) => {
                    let rest = &cluster[pos + c.len_utf8()..];
                    let arg = if !rest.is_empty() {
                        rest.to_string()
                    } else if i < args.len() {
                        i += 1;
                        args[i - 1].clone()
                    } else {
                        return Err(format!("option -{c} requires an argument (run with -h for help)"));
                    };
                    items.push(Item::Opt(c, Some(arg)));
                    break;
                }
            }
        }
    }
    Ok(items)
}

pub(super) fn invalid_option(c: char) -> String {
    format!("invalid option -{c} (run with -h for help)")
}
