include!("../../proto/compile.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    compile_csi(std::path::Path::new("../../proto"))
}
