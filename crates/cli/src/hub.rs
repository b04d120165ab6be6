//! Model ids (`Qwen/Qwen3-8B`) resolved through the Hugging Face cache, as vLLM (through
//! `huggingface_hub`) finds them: `<cache>/models--Qwen--Qwen3-8B/snapshots/<commit>/`, the commit
//! named by `refs/<revision>` (default `main`) or given as a 40-hex revision. The cache is
//! `--download-dir`, else `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
//! Downloading a model that is not in the cache is not built yet: the error says where the id
//! was looked for, so it can be fetched there (`huggingface-cli download`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Where to look: `--download-dir`, then the environment, as `huggingface_hub` does.
pub fn cache_dir(download_dir: Option<&Path>) -> PathBuf {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = download_dir {
        return dir.to_path_buf();
    }
    if let Some(dir) = env("HF_HUB_CACHE") {
        return dir;
    }
    if let Some(home) = env("HF_HOME") {
        return home.join("hub");
    }
    let base =
        env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join(".cache"))).unwrap_or_else(std::env::temp_dir);
    base.join("huggingface").join("hub")
}

/// Whether `model` reads as a Hub id (`name` or `org/name`) rather than a path.
fn looks_like_id(model: &str) -> bool {
    let parts: Vec<&str> = model.split('/').collect();
    let ok = |p: &str| !p.is_empty() && p != "." && p != ".." && !p.starts_with('.');
    parts.len() <= 2 && parts.iter().all(|p| ok(p)) && !model.ends_with(".gguf")
}

/// `model` as a local path: itself when it exists, else its snapshot in the cache.
pub fn resolve(model: &Path, revision: Option<&str>, download_dir: Option<&Path>) -> Result<PathBuf> {
    if model.exists() {
        if revision.is_some() {
            bail!("--revision {}: {} is a local path, not a model id", revision.unwrap_or_default(), model.display());
        }
        return Ok(model.to_path_buf());
    }
    let id = model.to_str().filter(|m| looks_like_id(m));
    let Some(id) = id else {
        bail!("{}: no such file or directory", model.display());
    };
    let cache = cache_dir(download_dir);
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let revision = revision.unwrap_or("main");
    let commit = if revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()) {
        revision.to_string()
    } else {
        let refs = repo.join("refs").join(revision);
        match std::fs::read_to_string(&refs) {
            Ok(text) => text.trim().to_string(),
            Err(_) => bail!(
                "{id}: not a local path, and revision {revision:?} is not in the Hugging Face cache ({} has no {}); \
                 downloading from the Hub is not built yet: fetch it there first (huggingface-cli download {id})",
                cache.display(),
                refs.strip_prefix(&cache).unwrap_or(&refs).display()
            ),
        }
    };
    let snapshot = repo.join("snapshots").join(&commit);
    if !snapshot.join("config.json").exists() {
        bail!("{id}: the cached snapshot {} has no config.json (an incomplete download?)", snapshot.display());
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(id: &str, commit: &str) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        let repo = dir.path.join(format!("models--{}", id.replace('/', "--")));
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), format!("{commit}\n")).unwrap();
        let snapshot = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("config.json"), "{}").unwrap();
        dir
    }

    /// A scratch directory removed on drop (std has none; a dependency for this alone is not worth it).
    mod tempdir {
        pub struct Dir {
            pub path: std::path::PathBuf,
        }
        impl Dir {
            pub fn new() -> Dir {
                static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = std::env::temp_dir().join(format!("ferrite-hub-test-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&path).unwrap();
                Dir { path }
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.path);
            }
        }
    }

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn ids_resolve_to_their_cached_snapshot() {
        let cache = cache_with("Org/Model-1", COMMIT);
        let want = cache.path.join("models--Org--Model-1").join("snapshots").join(COMMIT);
        assert_eq!(resolve(Path::new("Org/Model-1"), None, Some(&cache.path)).unwrap(), want);
        assert_eq!(resolve(Path::new("Org/Model-1"), Some(COMMIT), Some(&cache.path)).unwrap(), want);
    }

    #[test]
    fn missing_ids_and_revisions_say_where_they_were_looked_for() {
        let cache = cache_with("Org/Model-1", COMMIT);
        let err = resolve(Path::new("Org/Other"), None, Some(&cache.path)).unwrap_err().to_string();
        assert!(err.contains("Org/Other") && err.contains("not built yet") && err.contains("huggingface-cli"), "{err}");
        let err = resolve(Path::new("Org/Model-1"), Some("v2"), Some(&cache.path)).unwrap_err().to_string();
        assert!(err.contains("\"v2\"") && err.contains("refs/v2"), "{err}");
        let err = resolve(Path::new("./nope/model"), None, Some(&cache.path)).unwrap_err().to_string();
        assert!(err.contains("no such file"), "{err}");
    }

    #[test]
    fn local_paths_win_and_take_no_revision() {
        let cache = cache_with("Org/Model-1", COMMIT);
        assert_eq!(resolve(&cache.path, None, None).unwrap(), cache.path);
        assert!(resolve(&cache.path, Some("main"), None).is_err());
    }
}
