//! # uct - the transport API (in progress)
