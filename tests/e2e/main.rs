//! End-to-end tests of the whole system: the `poimen` binary as users run it
//! (every verb, every kind of bad input), the crash matrix with real
//! processes killed by SIGKILL, the MCP server driven by a real MCP client,
//! and the embedding example. One test binary, so wasmtime links once.

mod cli;
mod crash;
mod embed;
mod hosts;
mod languages;
mod mcp;
mod shadow;
mod support;
