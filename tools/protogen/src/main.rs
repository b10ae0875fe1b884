//! Writes the prost code for the ZDS protocol next to its schema. Paths are relative to the
//! repository root, found from this tool's own manifest directory.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("src/zds");
    let descriptors = protox::compile([dir.join("zds.proto")], [&dir])?;
    prost_build::Config::new()
        .out_dir(&dir)
        .compile_fds(descriptors)?;
    println!("wrote {}", dir.join("istio.workload.zds.rs").display());
    Ok(())
}
