//! Printing configurations in UCX's `ucx_info -c` / `ucx_info -f` format, per struct and for
//! every table read so far in the process.

use std::any::TypeId;
use std::fmt::Write;

use parking_lot::Mutex;

use super::env::ProcessEnv;
use super::Config;

/// Formats `config`'s options; see [`Config::print_with`].
pub(crate) fn print_table<T: Config>(config: &T, env_prefix: &str, prefixes: &[&str], with_docs: bool) -> String {
    let (head, inherited) = match prefixes.split_first() {
        Some((head, rest)) => (*head, rest),
        None => ("", &[][..]),
    };
    let mut out = String::new();
    for field in T::table().fields {
        let value = (field.format)(config);
        if with_docs {
            out.push_str("#\n");
            for line in field.doc.lines() {
                out.push_str(format!("# {line}").trim_end());
                out.push('\n');
            }
            out.push_str("#\n");
            let _ = writeln!(out, "# {:<10} {}", "syntax:", (field.syntax)());
            if !inherited.is_empty() {
                let names: Vec<String> = inherited.iter().map(|p| format!("{env_prefix}{p}{}", field.name)).collect();
                let _ = writeln!(out, "# {:<10} {}", "inherits:", names.join(", "));
            }
            out.push_str("#\n");
        }
        let _ = writeln!(out, "{env_prefix}{head}{}={value}", field.name);
        if with_docs {
            out.push('\n');
        }
    }
    out
}

type PrintFn = fn(&str, &[&str], bool) -> String;

struct Registered {
    type_id: TypeId,
    env_prefix: String,
    prefixes: Vec<String>,
    print: PrintFn,
}

static TABLES: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

fn print_registered<T: Config>(env_prefix: &str, prefixes: &[&str], with_docs: bool) -> String {
    let mut out = String::new();
    if with_docs {
        let scope: Vec<String> = prefixes.iter().map(|p| format!("{env_prefix}{p}")).collect();
        let _ = write!(out, "#\n# {} configuration ({})\n#\n\n", T::table().name, scope.join(", "));
    }
    match T::read_with(&ProcessEnv, env_prefix, prefixes) {
        Ok(config) => out.push_str(&config.print_with(env_prefix, prefixes, with_docs)),
        Err(e) => {
            let _ = writeln!(out, "# {}: {e}", T::table().name);
        }
    }
    out
}

/// Remembers that `T` was read with these prefixes, for [`print_all`].
pub(crate) fn register<T: Config>(env_prefix: &str, prefixes: &[&str]) {
    let type_id = TypeId::of::<T>();
    let mut tables = TABLES.lock();
    let known = tables.iter().any(|r| {
        r.type_id == type_id
            && r.env_prefix == env_prefix
            && r.prefixes.iter().map(String::as_str).eq(prefixes.iter().copied())
    });
    if !known {
        tables.push(Registered {
            type_id,
            env_prefix: env_prefix.to_string(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            print: print_registered::<T>,
        });
    }
}

/// Prints every configuration table read so far in this process (once per distinct set of
/// prefixes), re-reading each from the process environment, like `ucx_info -c` (or `-f`
/// with `with_docs`). A table whose environment no longer parses prints its error as a
/// comment.
pub fn print_all(with_docs: bool) -> String {
    // Copied out because printing reads the table again, which registers it.
    let entries: Vec<(String, Vec<String>, PrintFn)> =
        TABLES.lock().iter().map(|r| (r.env_prefix.clone(), r.prefixes.clone(), r.print)).collect();
    let mut out = String::new();
    if with_docs {
        out.push_str("# UCX library configuration\n\n");
    }
    for (env_prefix, prefixes, print) in entries {
        let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        out.push_str(&print(&env_prefix, &prefixes, with_docs));
    }
    out
}
