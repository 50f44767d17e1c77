//! End-to-end tests of the whole system: the `poimen` binary as users run it
//! (every verb, every kind of bad input), the crash matrix with real
//! processes killed by SIGKILL, the MCP server driven by a real MCP client,
//! and the embedding example. One test binary, so wasmtime links once.

mod arming;
mod cli;
mod console;
mod crash;
mod deadlines;
mod embed;
mod gc;
mod hostile;
mod hosts;
mod http;
mod languages;
mod mcp;
mod policies;
mod shadow;
mod support;
mod telemetry;
