//! Tells the accounting target which accountant API the metronome it builds against has, so
//! that it fuzzes every format there is: today's single OpenAI accountant, or, once the format
//! modules land (`Format::ALL` and `Accounting::for_format`), each format and the detector.

fn main() {
    let source = "../src/format/mod.rs";
    println!("cargo::rerun-if-changed={source}");
    println!("cargo::rustc-check-cfg=cfg(format_list)");
    let text = std::fs::read_to_string(source).unwrap_or_default();
    if text.contains("pub fn for_format") && text.contains("pub const ALL") {
        println!("cargo::rustc-cfg=format_list");
    }
}
