//! The UCP context (`ucp_context_h`): features, configuration and the transport resources
//! selected from what `uct` discovers.

use std::sync::Arc;

use bitflags::bitflags;
use ucs::{Status, UcsResult};
use uct::{DeviceType, ResourceDesc};

use crate::config::{ContextConfig, TlSelection, TlUse};

bitflags! {
    /// What the application will use (`UCP_FEATURE_*`, same bits).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Features: u64 {
        /// Tagged send/receive.
        const TAG = 1 << 0;
        /// Remote memory access.
        const RMA = 1 << 1;
        /// 32-bit atomics.
        const AMO32 = 1 << 2;
        /// 64-bit atomics.
        const AMO64 = 1 << 3;
        /// Blocking progress through an event fd.
        const WAKEUP = 1 << 4;
        /// Stream API.
        const STREAM = 1 << 5;
        /// Active messages.
        const AM = 1 << 6;
    }
}

/// Parameters of [`Context::new`] (`ucp_params_t`).
#[derive(Clone, Debug, Default)]
pub struct ContextParams {
    /// Features the application needs.
    pub features: Features,
    /// Expected number of endpoints per worker (a sizing hint).
    pub estimated_num_eps: usize,
    /// Configuration overrides (names without `UCX_`, e.g. `("TLS", "shm")`), applied over the
    /// environment like `ucp_config_modify`.
    pub config: Vec<(String, String)>,
    /// A name for diagnostics.
    pub name: String,
}

impl ContextParams {
    /// Parameters for `features`.
    pub fn new(features: Features) -> Self {
        ContextParams { features, ..Default::default() }
    }

    /// Adds a configuration override.
    pub fn with_config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.into(), value.into()));
        self
    }
}

/// A transport resource the context may use.
#[derive(Clone, Debug)]
pub struct Resource {
    /// What `uct` reported.
    pub desc: ResourceDesc,
    /// Full use, or wireup only.
    pub usage: TlUse,
    /// The context's overrides for this transport, named without its prefix.
    pub config: Vec<(String, String)>,
}

/// The overrides in `tl_config` that carry one of `prefixes` (the first that matches), with it
/// stripped; marks them in `used`.
fn config_for(tl_config: &[(String, String)], prefixes: &[&str], used: &mut [bool]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, (name, value)) in tl_config.iter().enumerate() {
        let upper = name.to_ascii_uppercase();
        if let Some(p) = prefixes.iter().find(|p| upper.starts_with(*p) && upper.len() > p.len()) {
            out.push((upper[p.len()..].to_string(), value.clone()));
            used[i] = true;
        }
    }
    out
}

struct Inner {
    params: ContextParams,
    config: ContextConfig,
    resources: Vec<Resource>,
    not_available: Vec<(String, String)>,
}

/// The UCP context. Cheap to clone; `Send + Sync`; workers are created from it.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("resources", &self.inner.resources).finish_non_exhaustive()
    }
}

impl Context {
    /// Reads the configuration, discovers transports through `uct` and selects them by
    /// `UCX_TLS` and the device lists. Transports named in `UCX_TLS` that are not available
    /// are reported ([`Context::not_available`], and a warning), not fatal; no usable transport
    /// at all is `NoDevice`.
    pub fn new(params: &ContextParams) -> UcsResult<Context> {
        if params.features.is_empty() {
            tracing::error!("ucp context: no features requested (TAG, RMA, AMO32, AMO64, AM, STREAM, WAKEUP)");
            return Err(Status::InvalidParam);
        }
        let config = ContextConfig::read(None, &params.config)?;
        Self::with_config(params, config)
    }

    /// As [`Context::new`] with an already read configuration.
    pub fn with_config(params: &ContextParams, config: ContextConfig) -> UcsResult<Context> {
        let all = uct::query_resources();
        let mut resources = Vec::new();
        let mut used = vec![false; config.tl_config.len()];
        for desc in all.iter() {
            let usage = config.tls.use_of(&desc.tl.tl_name);
            if usage == TlUse::Excluded {
                continue;
            }
            let devices = match desc.tl.dev_type {
                DeviceType::Net => &config.net_devices,
                DeviceType::Shm => &config.shm_devices,
                DeviceType::SelfDev => &config.self_devices,
                DeviceType::Acc => continue,
            };
            if !devices.allows(&desc.tl.dev_name) {
                continue;
            }
            let tl_config = config_for(&config.tl_config, desc.tl.config_prefixes, &mut used);
            resources.push(Resource { desc: desc.clone(), usage, config: tl_config });
        }
        // Names the user asked for that match nothing here.
        let mut not_available = Vec::new();
        if !config.tls.is_deny() {
            let unavailable = uct::unavailable_components();
            for name in config.tls.named() {
                let members = TlSelection::members(&name);
                if members.iter().any(|m| all.iter().any(|r| &r.tl.tl_name == m)) {
                    continue;
                }
                let why = unavailable
                    .iter()
                    .find(|(c, _)| members.iter().any(|m| m == c))
                    .map(|(_, r)| r.clone())
                    .unwrap_or_else(|| "no such transport on this machine".into());
                let valid: Vec<String> = all.iter().map(|r| r.tl.tl_name.clone()).collect();
                tracing::warn!("UCX_TLS: transport '{name}' is not available ({why}); available: {}", valid.join(", "));
                not_available.push((name, why));
            }
        }
        // As UCX: a setting no transport in use takes is reported, not fatal.
        for ((name, value), _) in config.tl_config.iter().zip(&used).filter(|(_, u)| !**u) {
            tracing::warn!(
                "ucp: invalid configuration {name}={value}: neither UCP nor a transport in use has this setting"
            );
        }
        if resources.iter().all(|r| r.usage != TlUse::Full) {
            tracing::error!("no usable transports (UCX_TLS and the device lists left none)");
            return Err(Status::NoDevice);
        }
        Ok(Context { inner: Arc::new(Inner { params: params.clone(), config, resources, not_available }) })
    }

    /// The selected resources, in discovery order.
    pub fn resources(&self) -> &[Resource] {
        &self.inner.resources
    }

    /// Transports named in `UCX_TLS` that this machine does not have, with the reason.
    pub fn not_available(&self) -> &[(String, String)] {
        &self.inner.not_available
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ContextConfig {
        &self.inner.config
    }

    /// The features asked for.
    pub fn features(&self) -> Features {
        self.inner.params.features
    }

    /// The parameters the context was created with.
    pub fn params(&self) -> &ContextParams {
        &self.inner.params
    }
}
