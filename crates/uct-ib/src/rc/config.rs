//! `UCX_RC_VERBS_*`, `UCX_RC_*` and `UCX_IB_*` settings of an `rc_verbs` interface (UCX 1.13
//! names and defaults), read in that order of precedence.

use std::time::Duration;

use ucs::config::{AutoOr, Config, ConfigSource, MemUnits};
use ucs::{Status, UcsResult};

use crate::ib_config::IbIfaceConfig;

ucs::config_table! {
    /// Options of an `rc_verbs` interface.
    pub struct RcConfigTable {
        pub path_mtu: String = ("PATH_MTU", "default", "Path MTU: default, 512, 1024, 2048 or 4096."),
        pub timeout: Duration = ("TIMEOUT", "1.0s", "Transport timeout (before a retry)."),
        pub retry_count: u32 = ("RETRY_COUNT", "7", "Transport retries before an error (0..7)."),
        pub rnr_timeout: Duration = ("RNR_TIMEOUT", "1ms", "Receiver-not-ready timeout."),
        pub rnr_retry_count: u32 = ("RNR_RETRY_COUNT", "7", "RNR retries (0..7, 7 is infinite)."),
        pub max_rd_atomic: AutoOr<u32> = ("MAX_RD_ATOMIC", "auto", "Outstanding RDMA reads and atomics per QP."),
        pub fc_enable: bool = ("FC_ENABLE", "y", "Enable active-message flow control."),
        pub fc_wnd_size: u32 = ("FC_WND_SIZE", "512", "Active messages an endpoint may send before a credit grant."),
        pub fc_hard_thresh: f64 = ("FC_HARD_THRESH", "0.25",
            "Window fraction at which a hard credit request is sent (0 < x < 1)."),
        pub fc_soft_thresh: f64 = ("FC_SOFT_THRESH", "0.5",
            "Window fraction at which a soft credit request is sent (hard < x < 1)."),
        pub tx_cq_moderation: u32 = ("TX_CQ_MODERATION", "64", "Send completions are requested every this many sends."),
        pub tx_cq_len: u32 = ("TX_CQ_LEN", "4096", "Length of the send completion queue."),
        pub max_am_hdr: u32 = ("MAX_AM_HDR", "128", "Largest user header of a zero-copy active message."),
        pub tm_enable: bool = ("TM_ENABLE", "n",
            "Enable tag-matching offload (emulated: a software model of the device's matching, see \
             docs/uct-ib/tag-matching.md); active only when the interface is opened with tag handlers."),
        pub tm_list_size: u32 = ("TM_LIST_SIZE", "1024", "Receives posted to the tag-matching list at most."),
        pub tm_emulate: bool = ("TM_EMULATE", "y",
            "Match with the software model of a tag-matching device. Devices with hardware tag \
             matching are not driven by this implementation yet: 'n' leaves tag matching off."),
        pub tm_emu_num_tags: u32 = ("TM_EMU_NUM_TAGS", "64",
            "Tags the emulated device holds (its max_num_tags; TM_LIST_SIZE caps it further)."),
        pub tm_emu_op_delay: u32 = ("TM_EMU_OP_DELAY", "0",
            "Emulated device: list operations run this many progress calls after they were posted \
             (0: at once), so that messages arrive between a tag add and its execution."),
        pub tm_seg_size: MemUnits = ("TM_SEG_SIZE", "48k",
            "Receive segment with tag matching on: the largest eager tagged message (at least SEG_SIZE is used)."),
    }
}

/// Validated settings of one `rc_verbs` interface.
#[derive(Clone, Debug, PartialEq)]
pub struct RcConfig {
    /// The settings every verbs transport has (buffers, queues, addressing).
    pub ib: IbIfaceConfig,
    /// Path MTU cap, as `IBV_MTU_*` (None: the port's active MTU).
    pub path_mtu: Option<u32>,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout.
    pub timeout_exp: u8,
    /// Retries.
    pub retry_count: u8,
    /// RNR timer code.
    pub min_rnr_timer: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Outstanding reads and atomics (None: the device maximum).
    pub max_rd_atomic: Option<u32>,
    /// AM window (0: no flow control).
    pub fc_wnd_size: u32,
    /// Window value at which a hard request goes out.
    pub fc_hard_thresh: u32,
    /// Window value at which a soft request goes out.
    pub fc_soft_thresh: u32,
    /// Signal every this many sends.
    pub tx_cq_moderation: u32,
    /// Send CQ length.
    pub tx_cq_len: u32,
    /// Largest zero-copy AM user header.
    pub max_am_hdr: usize,
    /// Tag-matching offload asked for (`TM_ENABLE`).
    pub tm_enable: bool,
    /// Tagged receives posted at most (`TM_LIST_SIZE`).
    pub tm_list_size: u32,
    /// Receive segment when tag matching is on (`TM_SEG_SIZE`, at least `SEG_SIZE`).
    pub tm_seg_size: usize,
    /// Use the emulated device (`TM_EMULATE`).
    pub tm_emulate: bool,
    /// The emulated device's tag list size (`TM_EMU_NUM_TAGS`).
    pub tm_emu_num_tags: u32,
    /// Progress calls before the emulated device runs a list operation (`TM_EMU_OP_DELAY`).
    pub tm_emu_op_delay: u32,
}

fn invalid(var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    crate::ib_config::invalid(super::CONFIG_PREFIXES, var, value, why)
}

/// The IB timeout exponent `t` with 4.096 us * 2^t >= `d` (0..=31).
pub(crate) fn timeout_exponent(d: Duration) -> u8 {
    let ns = d.as_nanos() as f64;
    (0u8..=31).find(|&t| 4096.0 * (1u64 << t) as f64 >= ns).unwrap_or(31)
}

/// The RNR NAK timer code for at least `d` (IBTA table; code 0 is the longest, 655.36 ms).
pub(crate) fn rnr_timer_code(d: Duration) -> u8 {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680, 10240,
        15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760, 327_680, 491_520,
    ];
    let us = d.as_micros();
    (1..32).find(|&i| US[i] as u128 >= us).map_or(0, |i| i as u8)
}

impl RcConfig {
    /// Receives the tag-matching list holds: the emulated device's size, capped by
    /// `TM_LIST_SIZE` (UCX: the device's `max_num_tags`, capped the same way).
    pub fn tm_num_tags(&self) -> u32 {
        self.tm_list_size.min(self.tm_emu_num_tags)
    }

    /// Reads the environment (or `source`), then `overrides`, and validates.
    pub fn read(source: Option<&dyn ConfigSource>, overrides: &[(String, String)]) -> UcsResult<RcConfig> {
        let prefixes = super::CONFIG_PREFIXES;
        let (ib, overrides) = IbIfaceConfig::read(source, prefixes, overrides, 64)?;
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => RcConfigTable::read_from(s, prefixes),
            None => RcConfigTable::read(prefixes),
        }
        .map_err(report)?;
        for (name, value) in overrides {
            t.set(name, value).map_err(report)?;
        }
        let byte = |name: &str, v: u32, max: u32| -> UcsResult<u8> {
            if v > max {
                Err(invalid(name, v, &format!("must be 0..{max}")))
            } else {
                Ok(v as u8)
            }
        };
        let path_mtu = match t.path_mtu.to_ascii_lowercase().as_str() {
            "default" => None,
            "512" => Some(rdma_core_sys::IBV_MTU_512),
            "1024" => Some(rdma_core_sys::IBV_MTU_1024),
            "2048" => Some(rdma_core_sys::IBV_MTU_2048),
            "4096" => Some(rdma_core_sys::IBV_MTU_4096),
            other => return Err(invalid("PATH_MTU", other, "must be default, 512, 1024, 2048 or 4096")),
        };
        let fc_wnd_size = if t.fc_enable { t.fc_wnd_size } else { 0 };
        if t.fc_enable && t.fc_wnd_size < 2 {
            return Err(invalid("FC_WND_SIZE", t.fc_wnd_size, "must be at least 2"));
        }
        if !(t.fc_hard_thresh > 0.0 && t.fc_hard_thresh < 1.0) {
            return Err(invalid("FC_HARD_THRESH", t.fc_hard_thresh, "must be > 0 and < 1"));
        }
        if !(t.fc_soft_thresh > t.fc_hard_thresh && t.fc_soft_thresh < 1.0) {
            return Err(invalid("FC_SOFT_THRESH", t.fc_soft_thresh, "must be > FC_HARD_THRESH and < 1"));
        }
        if t.tx_cq_moderation == 0 {
            return Err(invalid("TX_CQ_MODERATION", 0, "must be at least 1"));
        }
        if t.tx_cq_len < 16 {
            return Err(invalid("TX_CQ_LEN", t.tx_cq_len, "must be at least 16"));
        }
        let max_rd_atomic = match t.max_rd_atomic {
            AutoOr::Auto => None,
            AutoOr::Value(0) => return Err(invalid("MAX_RD_ATOMIC", 0, "must be at least 1")),
            AutoOr::Value(v) => Some(v),
        };
        if !(1..=(1 << 16)).contains(&t.tm_list_size) {
            return Err(invalid("TM_LIST_SIZE", t.tm_list_size, "must be 1..65536"));
        }
        let tm_seg_size = match t.tm_seg_size {
            MemUnits::Value(v) if v <= 1 << 20 => v.max(ib.seg_size),
            MemUnits::Auto => (48 << 10).max(ib.seg_size),
            other => return Err(invalid("TM_SEG_SIZE", format!("{other:?}"), "must be at most 1 MiB")),
        };
        if !(1..=(1 << 16)).contains(&t.tm_emu_num_tags) {
            return Err(invalid("TM_EMU_NUM_TAGS", t.tm_emu_num_tags, "must be 1..65536"));
        }
        if t.tm_emu_op_delay > 1000 {
            return Err(invalid("TM_EMU_OP_DELAY", t.tm_emu_op_delay, "must be 0..1000"));
        }
        Ok(RcConfig {
            tm_emulate: t.tm_emulate,
            tm_emu_num_tags: t.tm_emu_num_tags,
            tm_emu_op_delay: t.tm_emu_op_delay,
            tm_enable: t.tm_enable,
            tm_list_size: t.tm_list_size,
            tm_seg_size,
            path_mtu,
            timeout_exp: timeout_exponent(t.timeout),
            retry_count: byte("RETRY_COUNT", t.retry_count, 7)?,
            min_rnr_timer: rnr_timer_code(t.rnr_timeout),
            rnr_retry: byte("RNR_RETRY_COUNT", t.rnr_retry_count, 7)?,
            max_rd_atomic,
            fc_wnd_size,
            fc_hard_thresh: ((fc_wnd_size as f64 * t.fc_hard_thresh) as u32).max(1),
            fc_soft_thresh: ((fc_wnd_size as f64 * t.fc_soft_thresh) as u32).max(1),
            // At most half the send queue unsignaled, so credits always come back.
            tx_cq_moderation: t.tx_cq_moderation.min(ib.tx_queue_len / 2).max(1),
            tx_cq_len: t.tx_cq_len,
            max_am_hdr: t.max_am_hdr as usize,
            ib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(env: &[(&str, &str)], ov: &[(&str, &str)]) -> UcsResult<RcConfig> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let ov: Vec<(String, String)> = ov.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RcConfig::read(Some(&env), &ov)
    }

    #[test]
    fn defaults_match_ucx() {
        let c = read(&[], &[]).unwrap();
        assert_eq!((c.ib.seg_size, c.ib.tx_queue_len, c.ib.rx_queue_len), (8192, 256, 4096));
        assert_eq!((c.fc_wnd_size, c.fc_hard_thresh, c.fc_soft_thresh), (512, 128, 256));
        assert_eq!(c.tx_cq_moderation, 64);
        assert_eq!(c.timeout_exp, 18, "1 s is 4.096 us * 2^18 (rounded up)");
        assert_eq!(c.min_rnr_timer, 14, "1 ms rounds up to 1.28 ms, code 14");
        assert_eq!((c.tm_enable, c.tm_list_size, c.tm_seg_size), (false, 1024, 48 << 10));
        assert_eq!((c.tm_emulate, c.tm_emu_num_tags, c.tm_emu_op_delay), (true, 64, 0));
    }

    #[test]
    fn tag_matching_settings() {
        let c =
            read(&[("UCX_RC_TM_ENABLE", "y"), ("UCX_RC_VERBS_TM_LIST_SIZE", "64")], &[("TM_SEG_SIZE", "4k")]).unwrap();
        assert_eq!((c.tm_enable, c.tm_list_size), (true, 64));
        assert_eq!(c.tm_seg_size, 8192, "never below SEG_SIZE");
        assert_eq!(read(&[("UCX_RC_TM_LIST_SIZE", "0")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_RC_TM_SEG_SIZE", "2m")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_RC_TM_ENABLE", "maybe")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_RC_TM_EMU_NUM_TAGS", "0")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_RC_TM_EMU_OP_DELAY", "5000")], &[]), Err(Status::InvalidParam));
        let c = read(&[("UCX_RC_TM_EMU_OP_DELAY", "3"), ("UCX_RC_TM_EMULATE", "n")], &[]).unwrap();
        assert_eq!((c.tm_emu_op_delay, c.tm_emulate), (3, false));
    }

    #[test]
    fn precedence_and_errors() {
        let c = read(&[("UCX_IB_SEG_SIZE", "4k"), ("UCX_RC_VERBS_SEG_SIZE", "2k")], &[]).unwrap();
        assert_eq!(c.ib.seg_size, 2048);
        let c = read(&[("UCX_RC_FC_ENABLE", "n")], &[]).unwrap();
        assert_eq!(c.fc_wnd_size, 0);
        assert_eq!(read(&[("UCX_RC_RETRY_COUNT", "9")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_IB_PATH_MTU", "1000")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_RC_FC_SOFT_THRESH", "0.1")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("NO_SUCH", "1")]), Err(Status::NoElem));
        assert_eq!(read(&[("UCX_IB_TX_QUEUE_LEN", "x")], &[]), Err(Status::InvalidParam));
    }

    #[test]
    fn timer_encodings() {
        assert_eq!(timeout_exponent(Duration::from_micros(4)), 0);
        assert_eq!(timeout_exponent(Duration::from_millis(100)), 15);
        assert_eq!(rnr_timer_code(Duration::from_micros(10)), 1);
        assert_eq!(rnr_timer_code(Duration::from_millis(1)), 14);
        assert_eq!(rnr_timer_code(Duration::from_secs(1)), 0);
    }
}
