//! Model ids (`Qwen/Qwen3-8B`) resolved through the Hugging Face cache, as vLLM (through
//! `huggingface_hub`) finds them: `<cache>/models--Qwen--Qwen3-8B/snapshots/<commit>/`, the commit
//! named by `refs/<revision>` (default `main`) or given as a 40-hex revision. The cache is
//! `--download-dir`, else `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
//! An id not in the cache is downloaded there with the `hf-hub` crate (the configs, tokenizer
//! files and safetensors weights; `HF_ENDPOINT`, `HF_TOKEN`, resumed after a cut), unless
//! `HF_HUB_OFFLINE=1`. `org/name:file.gguf` names one GGUF file of a repository, fetched alone;
//! `org/name:Q4_K_M` (vLLM's form) the repository's one GGUF file of that quantization.

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
    let gguf =
        model.to_str().and_then(|m| m.split_once(':')).filter(|(id, f)| looks_like_id(id) && f.ends_with(".gguf"));
    if let Some((id, file)) = gguf {
        return resolve_file(id, file, revision.unwrap_or("main"), &cache_dir(download_dir));
    }
    let quant = model.to_str().and_then(|m| m.split_once(':')).filter(|(id, tag)| {
        looks_like_id(id) && !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    if let Some((id, tag)) = quant {
        return resolve_quant(id, tag, revision.unwrap_or("main"), &cache_dir(download_dir));
    }
    let id = model.to_str().filter(|m| looks_like_id(m));
    let Some(id) = id else {
        bail!("{}: no such file or directory", model.display());
    };
    let cache = cache_dir(download_dir);
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let revision = revision.unwrap_or("main");
    let commit = if revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()) {
        Some(revision.to_string())
    } else {
        std::fs::read_to_string(repo.join("refs").join(revision)).ok().map(|text| text.trim().to_string())
    };
    let snapshot = match commit.map(|c| repo.join("snapshots").join(c)).filter(|s| s.join("config.json").exists()) {
        Some(snapshot) => snapshot,
        None if offline() => bail!(
            "{id}: revision {revision:?} is not in the Hugging Face cache ({}) and HF_HUB_OFFLINE=1 forbids \
             downloading it",
            cache.display()
        ),
        None => download(id, revision, &cache)?,
    };
    Ok(snapshot)
}

/// One file of a repository (a GGUF checkpoint), from the cache or downloaded alone.
fn resolve_file(id: &str, file: &str, revision: &str, cache: &Path) -> Result<PathBuf> {
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let cached = std::fs::read_to_string(repo.join("refs").join(revision))
        .ok()
        .map(|commit| repo.join("snapshots").join(commit.trim()).join(file))
        .filter(|path| path.exists());
    match cached {
        Some(path) => Ok(path),
        None if offline() => {
            bail!("{id}:{file} is not in the Hugging Face cache ({}) and HF_HUB_OFFLINE=1", cache.display())
        }
        None => {
            eprintln!("ferrite: downloading {file} of {id} into {}", cache.display());
            let repo = hub_repo(id, revision, cache)?;
            repo.get(file).map_err(|e| hub_error(id, e))
        }
    }
}

/// The one GGUF file of `id` whose name carries the quantization `tag` (`Q4_K_M`).
fn resolve_quant(id: &str, tag: &str, revision: &str, cache: &Path) -> Result<PathBuf> {
    let matches = |file: &str| {
        let lower = file.to_ascii_lowercase();
        lower.ends_with(".gguf") && lower.contains(&tag.to_ascii_lowercase())
    };
    let pick = |files: Vec<String>| -> Result<String> {
        let found: Vec<String> = files.into_iter().filter(|f| matches(f)).collect();
        match found.as_slice() {
            [one] => Ok(one.clone()),
            [] => bail!("{id}: no GGUF file of quantization {tag:?} at revision {revision:?}"),
            many => bail!("{id}: several GGUF files match {tag:?} ({}); name one as {id}:FILE.gguf", many.join(", ")),
        }
    };
    if offline() {
        let repo = cache.join(format!("models--{}", id.replace('/', "--")));
        let commit = std::fs::read_to_string(repo.join("refs").join(revision)).unwrap_or_default();
        let snapshot = repo.join("snapshots").join(commit.trim());
        let files = std::fs::read_dir(&snapshot)
            .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        return Ok(snapshot.join(pick(files)?));
    }
    let info = hub_repo(id, revision, cache)?.info().map_err(|e| hub_error(id, e))?;
    let file = pick(info.siblings.into_iter().map(|s| s.rfilename).collect())?;
    resolve_file(id, &file, revision, cache)
}

fn offline() -> bool {
    std::env::var_os("HF_HUB_OFFLINE").is_some_and(|v| v == "1")
}

/// A Hub error with the id and, for the usual causes, what to do.
fn hub_error(id: &str, e: hf_hub::api::sync::ApiError) -> anyhow::Error {
    let text = e.to_string();
    let hint = if text.contains("401") || text.contains("403") {
        " (a gated or private model: set HF_TOKEN to a token that may read it)"
    } else if text.contains("404") {
        " (no such model, file or revision on the Hub)"
    } else {
        ""
    };
    anyhow::anyhow!("{id}: downloading from the Hub: {text}{hint}")
}

/// The Hub client for `id` at `revision`, caching into `cache`.
fn hub_repo(id: &str, revision: &str, cache: &Path) -> Result<hf_hub::api::sync::ApiRepo> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        .with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_retries(3);
    if let Some(endpoint) = env("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(token) = env("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder.build().map_err(|e| hub_error(id, e))?;
    Ok(api.repo(Repo::with_revision(id.to_owned(), RepoType::Model, revision.to_owned())))
}

/// The files a checkpoint directory needs: configs, tokenizer files, chat templates and
/// safetensors weights (not the PyTorch, TensorFlow or ONNX copies a repository may also hold).
fn needed(file: &str) -> bool {
    [".json", ".safetensors", ".jinja", ".model", ".txt"].iter().any(|ext| file.ends_with(ext))
}

/// Downloads what `id` at `revision` needs into `cache` and returns its snapshot directory.
fn download(id: &str, revision: &str, cache: &Path) -> Result<PathBuf> {
    let repo = hub_repo(id, revision, cache)?;
    let info = repo.info().map_err(|e| hub_error(id, e))?;
    let files: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).filter(|f| needed(f)).collect();
    if !files.contains(&"config.json") {
        bail!("{id}: the repository has no config.json at revision {revision:?}: not a checkpoint ferrite loads");
    }
    eprintln!("ferrite: downloading {id} ({} files) into {}", files.len(), cache.display());
    let mut snapshot = None;
    for file in files {
        let path = repo.get(file).map_err(|e| hub_error(id, e))?;
        if file == "config.json" {
            snapshot = path.parent().map(Path::to_path_buf);
        }
    }
    snapshot.ok_or_else(|| anyhow::anyhow!("{id}: config.json was downloaded outside a snapshot directory"))
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
    fn paths_that_are_not_ids_are_missing_files() {
        let err = resolve(Path::new("./nope/model"), None, None).unwrap_err().to_string();
        assert!(err.contains("no such file"), "{err}");
        assert!(!looks_like_id("a/b/c") && !looks_like_id("m.gguf") && looks_like_id("Org/Model-1"));
    }

    #[test]
    fn local_paths_win_and_take_no_revision() {
        let cache = cache_with("Org/Model-1", COMMIT);
        assert_eq!(resolve(&cache.path, None, None).unwrap(), cache.path);
        assert!(resolve(&cache.path, Some("main"), None).is_err());
    }
}
