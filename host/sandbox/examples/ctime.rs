#![allow(clippy::unwrap_used)]
fn main() {
    for path in std::env::args().skip(1) {
        let bytes = std::fs::read(&path).unwrap();
        let e = poimen_sandbox::default_engine();
        let t = std::time::Instant::now();
        let _ = wasmtime::component::Component::new(&e, &bytes).unwrap();
        println!("{path}: {:?}", t.elapsed());
    }
}
