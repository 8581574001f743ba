//! The uct conformance kit's agent: holds the receiving side of the kit's checks for a test in
//! another process ([`uct::conformance::serve_agent`]), over every transport of the workspace.
//! Started by the tests through `CARGO_BIN_EXE_kit-agent`; not meant to be run by hand.

fn main() {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    uct::conformance::serve_agent();
}
