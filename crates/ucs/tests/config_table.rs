//! Configuration tables: defaults, prefix inheritance, custom env prefixes, errors,
//! programmatic overrides and printing, all from explicit sources (the process environment
//! is left alone).

use std::collections::HashMap;
use std::time::Duration;

use ucs::config::{AllowList, Bandwidth, Config, ConfigError, ConfigValue, MemUnits, OnOffAuto, Ternary, TimeValue};
use ucs::Status;

ucs::config_enum! {
    /// Rendezvous scheme.
    pub enum RndvScheme { Auto = "auto", GetZcopy = "get_zcopy", PutZcopy = "put_zcopy", Am = "am" }
}

ucs::config_table! {
    /// Posix shared-memory iface configuration.
    pub struct MmIfaceConfig {
        /// Number of elements in the receive FIFO.
        pub fifo_size: u32 = ("FIFO_SIZE", "64", "Size of the receive FIFO in the memory-mapped transports."),
        pub seg_size: MemUnits = ("SEG_SIZE", "8256", "Size of send/receive segment"),
        pub alloc: AllowList = ("ALLOC", "md,mmap,heap", "Allocation methods, in order of preference."),
        pub timeout: Duration = ("TIMEOUT", "10ms", "Completion timeout\nsecond line"),
        pub keepalive: TimeValue = ("KEEPALIVE_INTERVAL", "auto", "Keepalive interval"),
        pub bw: Bandwidth = ("BW", "12179MBs", "Bandwidth"),
        pub hugetlb: Ternary = ("HUGETLB_MODE", "try", "Use huge pages"),
        pub error_handling: OnOffAuto = ("ERROR_HANDLING", "auto", "Error handling"),
        pub rndv: RndvScheme = ("RNDV_SCHEME", "auto", "Rendezvous scheme"),
        pub verbose: bool = ("VERBOSE", "n", "Verbose"),
        pub factor: f64 = ("FACTOR", "1.5", "Overhead factor"),
        pub offset: i32 = ("OFFSET", "-3", "Offset"),
        pub devices: Vec<String> = ("DEVICES", "", "Devices"),
        pub name: String = ("NAME", "mm", "Name"),
    }
}

fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn defaults_parse() {
    let c = MmIfaceConfig::default();
    assert_eq!(c.fifo_size, 64);
    assert_eq!(c.seg_size, MemUnits::Value(8256));
    assert_eq!(c.alloc, AllowList::Allow(vec!["md".into(), "mmap".into(), "heap".into()]));
    assert_eq!(c.timeout, Duration::from_millis(10));
    assert_eq!(c.keepalive, TimeValue::Auto);
    assert_eq!(c.bw, Bandwidth::BytesPerSec(12179.0 * 1048576.0));
    assert_eq!(c.hugetlb, Ternary::Try);
    assert_eq!(c.error_handling, OnOffAuto::Auto);
    assert_eq!(c.rndv, RndvScheme::Auto);
    assert!(!c.verbose);
    assert_eq!(c.factor, 1.5);
    assert_eq!(c.offset, -3);
    assert!(c.devices.is_empty());
    assert_eq!(c.name, "mm");
    assert_eq!(MmIfaceConfig::try_default(), Ok(c.clone()));
    assert_eq!(MmIfaceConfig::read_from(&env(&[]), &["POSIX_", "MM_"]), Ok(c));
}

#[test]
fn prefix_inheritance() {
    let prefixes = ["POSIX_", "MM_"];
    let only_mm = env(&[("UCX_MM_FIFO_SIZE", "128")]);
    assert_eq!(MmIfaceConfig::read_from(&only_mm, &prefixes).unwrap().fifo_size, 128);

    let both = env(&[("UCX_MM_FIFO_SIZE", "128"), ("UCX_POSIX_FIFO_SIZE", "256")]);
    assert_eq!(MmIfaceConfig::read_from(&both, &prefixes).unwrap().fifo_size, 256);

    // A sibling table does not see this one's specific setting.
    assert_eq!(MmIfaceConfig::read_from(&both, &["SYSV_", "MM_"]).unwrap().fifo_size, 128);

    // An empty prefix means plain UCX_<NAME>, with the lowest precedence when last.
    let plain = env(&[("UCX_FIFO_SIZE", "32"), ("UCX_SEG_SIZE", "1m")]);
    let c = MmIfaceConfig::read_from(&plain, &["MM_", ""]).unwrap();
    assert_eq!((c.fifo_size, c.seg_size), (32, MemUnits::Value(1 << 20)));
    assert_eq!(MmIfaceConfig::read_from(&plain, &[]).unwrap().fifo_size, 32);
    let c = MmIfaceConfig::read_from(&env(&[("UCX_FIFO_SIZE", "32"), ("UCX_MM_FIFO_SIZE", "8")]), &["MM_", ""]);
    assert_eq!(c.unwrap().fifo_size, 8);
}

#[test]
fn overridden_bad_value_is_not_parsed() {
    let vars = env(&[("UCX_MM_FIFO_SIZE", "junk"), ("UCX_POSIX_FIFO_SIZE", "16")]);
    assert_eq!(MmIfaceConfig::read_from(&vars, &["POSIX_", "MM_"]).unwrap().fifo_size, 16);
}

#[test]
fn custom_env_prefix() {
    let vars = env(&[
        ("UCX_MM_FIFO_SIZE", "1"),
        ("UCX_POSIX_SEG_SIZE", "2k"),
        ("MYAPP_UCX_MM_SEG_SIZE", "4k"),
        ("MYAPP_UCX_MM_VERBOSE", "yes"),
    ]);
    let c = MmIfaceConfig::read_with(&vars, "MYAPP_UCX_", &["POSIX_", "MM_"]).unwrap();
    // The application's own prefix wins over the plain UCX_ one, at any table prefix.
    assert_eq!(c.seg_size, MemUnits::Value(4096));
    assert_eq!(c.fifo_size, 1);
    assert!(c.verbose);
    let c = MmIfaceConfig::read_with(&vars, "OTHER_", &["MM_"]).unwrap();
    assert_eq!(c, MmIfaceConfig::default());
}

#[test]
fn closure_source() {
    let source = |name: &str| (name == "UCX_MM_RNDV_SCHEME").then(|| "PUT_ZCOPY".to_string());
    let c = MmIfaceConfig::read_from(&source, &["MM_"]).unwrap();
    assert_eq!(c.rndv, RndvScheme::PutZcopy);
}

#[test]
fn error_names_variable_value_and_syntax() {
    let vars = env(&[("UCX_MM_FIFO_SIZE", "abc")]);
    let err = MmIfaceConfig::read_from(&vars, &["POSIX_", "MM_"]).unwrap_err();
    assert_eq!(err.to_string(), "invalid value for UCX_MM_FIFO_SIZE: \"abc\" (expected: unsigned integer)");
    assert_eq!(Status::from(err.clone()), Status::InvalidParam);
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.to_string().contains("UCX_MM_FIFO_SIZE"));

    let vars = env(&[("UCX_POSIX_RNDV_SCHEME", "fast")]);
    let err = MmIfaceConfig::read_from(&vars, &["POSIX_", "MM_"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value for UCX_POSIX_RNDV_SCHEME: \"fast\" (expected: [auto|get_zcopy|put_zcopy|am])"
    );

    let vars = env(&[("UCX_MM_SEG_SIZE", "8q")]);
    let msg = MmIfaceConfig::read_from(&vars, &["MM_"]).unwrap_err().to_string();
    assert!(msg.contains("UCX_MM_SEG_SIZE") && msg.contains("\"8q\"") && msg.contains("memory units"), "{msg}");

    let vars = env(&[("UCX_MM_FIFO_SIZE", "99999999999")]);
    let msg = MmIfaceConfig::read_from(&vars, &["MM_"]).unwrap_err().to_string();
    assert!(msg.contains("no larger than 4294967295"), "{msg}");

    let vars = env(&[("UCX_MM_NAME", "a\"b\n")]);
    assert_eq!(MmIfaceConfig::read_from(&vars, &["MM_"]).unwrap().name, "a\"b\n");
}

#[test]
fn set_and_get() {
    let mut c = MmIfaceConfig::default();
    c.set("FIFO_SIZE", "inf").unwrap();
    assert_eq!(c.fifo_size, u32::MAX);
    assert_eq!(c.get("FIFO_SIZE").unwrap(), "inf");
    c.set("ALLOC", "^heap").unwrap();
    assert!(!c.alloc.allows("heap") && c.alloc.allows("md"));
    assert_eq!(c.get("ALLOC").unwrap(), "^heap");
    assert_eq!(c.get("SEG_SIZE").unwrap(), "8256");
    c.set("SEG_SIZE", "16kb").unwrap();
    assert_eq!(c.get("SEG_SIZE").unwrap(), "16K");

    let err = c.set("FIFO_SIZE", "-1").unwrap_err();
    assert_eq!(err.to_string(), "invalid value for FIFO_SIZE: \"-1\" (expected: unsigned integer)");
    assert_eq!(c.fifo_size, u32::MAX, "a rejected value leaves the field unchanged");

    let err = c.set("NO_SUCH", "1").unwrap_err();
    assert!(matches!(err, ConfigError::UnknownField { .. }));
    assert_eq!(err.status(), Status::NoElem);
    assert!(err.to_string().contains("NO_SUCH") && err.to_string().contains("MmIfaceConfig"));
    assert!(c.get("fifo_size").is_err(), "names are case-sensitive");
}

#[test]
fn table_metadata() {
    let table = MmIfaceConfig::table();
    assert_eq!(table.name, "MmIfaceConfig");
    assert_eq!(table.fields.len(), 14);
    let f = table.field("SEG_SIZE").unwrap();
    assert_eq!((f.default, f.doc), ("8256", "Size of send/receive segment"));
    assert_eq!((f.syntax)(), MemUnits::syntax());
}

#[test]
fn print_plain_and_with_docs() {
    let c = MmIfaceConfig::default();
    let plain = c.print("MM_", false);
    let lines: Vec<&str> = plain.lines().collect();
    assert_eq!(lines.len(), 14);
    assert_eq!(lines[0], "UCX_MM_FIFO_SIZE=64");
    assert_eq!(lines[1], "UCX_MM_SEG_SIZE=8256");
    assert_eq!(lines[2], "UCX_MM_ALLOC=md,mmap,heap");
    assert_eq!(lines[3], "UCX_MM_TIMEOUT=10ms");
    assert_eq!(lines[5], "UCX_MM_BW=12179MBps");
    assert_eq!(lines[6], "UCX_MM_HUGETLB_MODE=try");
    assert_eq!(lines[12], "UCX_MM_DEVICES=");

    let docs = c.print_with("UCX_", &["POSIX_", "MM_"], true);
    assert!(
        docs.starts_with(
            "#\n# Size of the receive FIFO in the memory-mapped transports.\n#\n\
         # syntax:    unsigned integer\n# inherits:  UCX_MM_FIFO_SIZE\n#\nUCX_POSIX_FIFO_SIZE=64\n\n"
        ),
        "{docs}"
    );
    assert!(docs.contains("# Completion timeout\n# second line\n"), "{docs}");
    assert!(docs.contains("# syntax:    [auto|get_zcopy|put_zcopy|am]\n"), "{docs}");
}

#[test]
fn printed_values_read_back() {
    let vars = env(&[
        ("UCX_MM_FIFO_SIZE", "0x20"),
        ("UCX_MM_SEG_SIZE", "2M"),
        ("UCX_MM_TIMEOUT", "1.5s"),
        ("UCX_MM_KEEPALIVE_INTERVAL", "inf"),
        ("UCX_MM_BW", "10Gbps"),
        ("UCX_MM_FACTOR", "0.1"),
        ("UCX_MM_DEVICES", "mlx5_0:1,,mlx5_1:1"),
    ]);
    let c = MmIfaceConfig::read_from(&vars, &["MM_"]).unwrap();
    assert_eq!(c.devices, ["mlx5_0:1", "mlx5_1:1"]);
    let printed: HashMap<String, String> = c
        .print("MM_", false)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(MmIfaceConfig::read_from(&printed, &["MM_"]).unwrap(), c);
}

#[test]
fn reads_register_for_print_all() {
    ucs::config_table! {
        /// A table only this test reads.
        struct PrintAllProbe {
            level: u8 = ("PROBE_LEVEL_FOR_PRINT_ALL", "7", "Probe level"),
        }
    }
    let _ = PrintAllProbe::read_from(&env(&[]), &["TESTPFX_"]).unwrap().level;
    let all = ucs::config::print_all(false);
    assert!(all.contains("UCX_TESTPFX_PROBE_LEVEL_FOR_PRINT_ALL=7\n"), "{all}");
    let all = ucs::config::print_all(true);
    assert!(all.contains("# PrintAllProbe configuration (UCX_TESTPFX_)\n"), "{all}");
    assert!(ucs::config::used_env_vars().contains(&"UCX_TESTPFX_PROBE_LEVEL_FOR_PRINT_ALL".to_string()));
}
