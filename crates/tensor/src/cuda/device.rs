//! One context per GPU for the whole process: its stream, cuBLAS handle and compiled kernels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::driver::{
    sys as drv_sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::kernels::{self, KernelSource};
use crate::error::{Result, TensorError};

pub(crate) fn dev_err(what: impl std::fmt::Display) -> TensorError {
    TensorError::Device(what.to_string())
}

/// A kernel argument as `launch` passes it: device addresses and `size_t`s are `u64`.
#[derive(Clone, Copy)]
pub(crate) enum Arg {
    U64(u64),
    I32(i32),
    F32(f32),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::U64(v)
    }
}

impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}

impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}

/// Declares a kernel's parameters as a struct whose fields are in the order of its C signature
/// (device addresses and `size_t` as `u64`, `int` as `i32`, `float` as `f32`), with
/// `launch_with`: the one place where that order becomes the argument list, so that a launcher
/// names every argument instead of counting positions.
macro_rules! kernel_params {
    ($(#[$doc:meta])* $vis:vis struct $name:ident { $($field:ident: $ty:ty),+ $(,)? }) => {
        $(#[$doc])*
        $vis struct $name {
            $($vis $field: $ty),+
        }

        impl $name {
            fn launch_with(
                &self,
                dev: &$crate::cuda::device::CudaDevice,
                f: &cudarc::driver::CudaFunction,
                cfg: cudarc::driver::LaunchConfig,
            ) -> $crate::error::Result<()> {
                dev.launch(f, cfg, &[$($crate::cuda::device::Arg::from(self.$field)),+])
            }
        }
    };
}
pub(crate) use kernel_params;

/// A dimension or count as a C `int`, refusing what would wrap.
pub(crate) fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| dev_err(format!("size {v} does not fit a 32-bit kernel argument")))
}

/// The device address of `s`.
pub(crate) fn dptr<T>(s: &CudaSlice<T>, dev: &CudaDevice) -> u64 {
    s.device_ptr(dev.stream()).0
}

/// State an op module keeps for each device (its caches, a graph capture in progress), declared
/// by that module rather than as a field of [`CudaDevice`]: one lock per device all the same.
pub(crate) struct PerDevice<T>(OnceLock<Box<[Mutex<T>]>>);

impl<T: Default> PerDevice<T> {
    pub(crate) const fn new() -> PerDevice<T> {
        PerDevice(OnceLock::new())
    }

    pub(crate) fn of(&self, dev: &CudaDevice) -> &Mutex<T> {
        // Every device that exists has an ordinal below the count, which is fixed for the process.
        &self.0.get_or_init(|| (0..device_count()).map(|_| Mutex::default()).collect())[dev.ordinal]
    }
}

/// A GPU as the op set sees it. Everything is issued on one stream, so the order of ops is
/// the order of calls, and memory freed by a dropped tensor is reused only after the kernels
/// queued before the drop (stream-ordered allocation).
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    compute_capability: (i32, i32),
    /// The virtual architecture its kernel modules are compiled for (`compute_90`).
    arch: &'static str,
    multiprocessors: usize,
    max_shared_per_block: usize,
    stream: Arc<CudaStream>,
    blas: Mutex<blas_sys::cublasHandle_t>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Every module's compile (NVRTC, then the driver's JIT), started on its own thread when the
    /// device opens so that it overlaps loading the weights; taken by the first use.
    compiling: Mutex<HashMap<&'static str, std::thread::JoinHandle<Result<Arc<CudaModule>>>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Allocates the buffers a captured graph keeps, which must not come from the capture.
    side: Arc<CudaStream>,
    /// cuBLAS's scratch memory, ours so that captured GEMMs never allocate their own.
    _blas_workspace: cudarc::driver::CudaSlice<u8>,
}

// SAFETY: the cuBLAS handle is only used behind its mutex; every other field is Send + Sync.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{} ({})", self.ordinal, self.name)
    }
}

/// Whether a CUDA GPU can be used: the driver, NVRTC and cuBLAS libraries load and report at
/// least one device. Never panics; the answer is computed once per process.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices, 0 when the driver or the libraries are missing.
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        // SAFETY: these only try to dlopen the libraries by name and close them again.
        let present = unsafe {
            cudarc::driver::sys::is_culib_present()
                && cudarc::nvrtc::sys::is_culib_present()
                && cudarc::cublas::sys::is_culib_present()
        };
        if !present {
            return 0;
        }
        // cudarc panics when a symbol is missing from an older driver; that means "no GPU" here.
        std::panic::catch_unwind(|| CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)).unwrap_or(0)
    })
}

/// The process-wide context of GPU `ordinal`, created on first use.
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let count = device_count();
    if ordinal >= count {
        return Err(dev_err(if count == 0 {
            "no CUDA device (driver, libnvrtc or libcublas not found, or no GPU)".to_string()
        } else {
            format!("cuda:{ordinal} requested but only {count} device(s) exist")
        }));
    }
    let mut map = DEVICES.get_or_init(Default::default).lock().map_err(|_| dev_err("device table poisoned"))?;
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(CudaDevice::open(ordinal)?);
    map.insert(ordinal, d.clone());
    Ok(d)
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        let ctx = CudaContext::new(ordinal).map_err(dev_err)?;
        // One stream per device and no cross-stream use: cudarc's per-buffer events would only
        // add two event creations to every allocation.
        // SAFETY: called before this context allocates anything.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own rather than the legacy default stream, which cannot be captured
        // into CUDA graphs.
        let stream = ctx.new_stream().map_err(dev_err)?;
        let side = ctx.new_stream().map_err(dev_err)?;
        keep_pool_memory(&ctx)?;
        let attr = |a| ctx.attribute(a).map_err(dev_err);
        let multiprocessors = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_shared_per_block =
            attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let blas = blas_result::create_handle().map_err(dev_err)?;
        // cuBLAS's own default on Hopper; a GEMM captured into a graph must not allocate.
        let workspace_bytes = 32 << 20;
        let blas_workspace = stream.alloc_zeros::<u8>(workspace_bytes).map_err(dev_err)?;
        stream.synchronize().map_err(dev_err)?;
        // SAFETY: the handle is fresh; the stream and the workspace outlive it (all three live
        // in this struct).
        unsafe {
            blas_result::set_stream(blas, stream.cu_stream() as _).map_err(dev_err)?;
            {
                use cudarc::driver::DevicePtr;
                let ws = blas_workspace.device_ptr(&stream).0;
                blas_sys::cublasSetWorkspace_v2(blas, ws as *mut std::ffi::c_void, workspace_bytes)
                    .result()
                    .map_err(dev_err)?;
            }
            // Plain fp32 GEMMs: TF32 would cost f32 activations their exactness against the CPU.
            blas_sys::cublasSetMathMode(blas, blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH).result().map_err(dev_err)?;
        }
        let compute_capability = ctx.compute_capability().map_err(dev_err)?;
        let (major, minor) = compute_capability;
        // NVRTC's options take a 'static name; a device is opened once per process.
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        let compiling = kernels::modules()
            .filter_map(|source| {
                let ctx = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("nvrtc-{}", source.name))
                    .spawn(move || load_module(&ctx, source, arch));
                // Without a thread the module compiles on its first use instead.
                spawned.ok().map(|handle| (source.name, handle))
            })
            .collect();
        Ok(CudaDevice {
            ordinal,
            name: ctx.name().map_err(dev_err)?,
            compute_capability,
            arch,
            multiprocessors,
            max_shared_per_block,
            stream,
            blas: Mutex::new(blas),
            modules: Mutex::new(HashMap::new()),
            compiling: Mutex::new(compiling),
            functions: Mutex::new(HashMap::new()),
            side,
            _blas_workspace: blas_workspace,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The stream every op of this device is issued on (for events and graph capture).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn side_stream(&self) -> &Arc<CudaStream> {
        &self.side
    }

    /// `(free, total)` bytes of device memory; memory the stream-ordered pool keeps for reuse
    /// counts as used.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.stream.context().bind_to_thread().map_err(dev_err)?;
        cudarc::driver::result::mem_get_info().map_err(dev_err)
    }

    /// Blocks until every op issued so far has finished; reports asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(dev_err)
    }

    pub(crate) fn max_shared_per_block(&self) -> usize {
        self.max_shared_per_block
    }

    /// Runs `f` with the cuBLAS handle, which is bound to this device's stream.
    pub(crate) fn with_blas<R>(&self, f: impl FnOnce(blas_sys::cublasHandle_t) -> R) -> Result<R> {
        let handle = self.blas.lock().map_err(|_| dev_err("cuBLAS handle poisoned"))?;
        self.stream.context().bind_to_thread().map_err(dev_err)?;
        Ok(f(*handle))
    }

    /// The kernel `name` of `source`, compiling the source on its first use in this process.
    pub(crate) fn function(&self, source: KernelSource, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().map_err(|_| dev_err("function cache poisoned"))?.get(name) {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = self.modules.lock().map_err(|_| dev_err("module cache poisoned"))?;
            match modules.get(source.name) {
                Some(m) => m.clone(),
                None => {
                    let m = self.compile(source)?;
                    modules.insert(source.name, m.clone());
                    m
                }
            }
        };
        let f = module.load_function(name).map_err(|e| dev_err(format!("kernel {name}: {e}")))?;
        self.functions.lock().map_err(|_| dev_err("function cache poisoned"))?.insert(name.to_string(), f.clone());
        Ok(f)
    }

    fn compile(&self, source: KernelSource) -> Result<Arc<CudaModule>> {
        let started = self.compiling.lock().map_err(|_| dev_err("compile table poisoned"))?.remove(source.name);
        match started {
            Some(handle) => {
                handle.join().map_err(|_| dev_err(format!("compiling the {} kernels panicked", source.name)))?
            }
            None => load_module(self.stream.context(), source, self.arch),
        }
    }

    /// Launches `f` with `args` in the order of the kernel's C parameters. On sm_90 and later
    /// the launch allows programmatic dependent launch: the kernel may be scheduled while the
    /// previous one drains, and waits (`pdl_wait`) for its inputs before it reads any, which
    /// hides most of the gap between the short kernels of a decode step. Every kernel here
    /// begins with that wait, except that the GEMVs first issue loads of their weights.
    pub(crate) fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        if self.compute_capability.0 >= 9 {
            return self.launch_programmatic(f, cfg, args);
        }
        let mut builder = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::U64(v) => builder.arg(v),
                Arg::I32(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        // SAFETY: every caller passes arguments matching the kernel's C signature, with device
        // pointers into buffers that are alive now; frees are stream-ordered, so a buffer dropped
        // after this call is not reused before the kernel has run.
        unsafe { builder.launch(cfg) }.map(|_| ()).map_err(dev_err)
    }

    fn launch_programmatic(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        // cuLaunchKernelEx reads each parameter through a pointer to its value.
        let mut values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::U64(v) => v,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> =
            values.iter_mut().map(|v| v as *mut u64 as *mut std::ffi::c_void).collect();
        // SAFETY: the attribute is plain data (an id and a union of integers); all-zero is a
        // valid value of it, then the id and its member are set.
        let mut attr: drv_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = drv_sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        self.stream.context().bind_to_thread().map_err(dev_err)?;
        // SAFETY: as for `launch`; each parameter pointer addresses a value of the parameter's
        // size at its start (i32 and f32 in the low bytes of a little-endian u64), and `values`
        // outlives the call, which copies them.
        unsafe { drv_sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(dev_err)
    }
}

/// `source` compiled for `arch` and loaded into `ctx` (where the driver turns the PTX into
/// machine code, keeping it in its own cache, `~/.nv/ComputeCache`).
fn load_module(ctx: &Arc<CudaContext>, source: KernelSource, arch: &'static str) -> Result<Arc<CudaModule>> {
    let started = std::time::Instant::now();
    let module = ctx.load_module(cached_ptx(source, arch)?).map_err(dev_err)?;
    tracing::debug!(module = source.name, seconds = started.elapsed().as_secs_f64(), "kernels ready");
    Ok(module)
}

/// The PTX of `source` from the kernel cache, else from NVRTC (then stored in the cache).
/// NVRTC takes seconds for the attention module; a restart reads the file instead. The cache is
/// `$FERRITE_CACHE_DIR/kernels` (default `$XDG_CACHE_HOME/ferrite`, else `~/.cache/ferrite`),
/// each file named by a hash of everything that shapes the PTX; a cache that cannot be read or
/// written is skipped.
fn cached_ptx(source: KernelSource, arch: &'static str) -> Result<Ptx> {
    cached_ptx_in(kernel_cache_dir().as_deref(), source, arch)
}

fn cached_ptx_in(dir: Option<&std::path::Path>, source: KernelSource, arch: &'static str) -> Result<Ptx> {
    let path = dir.map(|dir| dir.join(format!("{}-{arch}-{:016x}.ptx", source.name, ptx_key(source, arch))));
    if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile_ptx(source, arch)?;
    if let Some(path) = path {
        if let Err(e) = store_atomically(&path, ptx.to_src().as_bytes()) {
            tracing::debug!(path = %path.display(), error = %e, "the kernel cache is not writable");
        }
    }
    Ok(ptx)
}

fn kernel_cache_dir() -> Option<std::path::PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    let root = var("FERRITE_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("ferrite")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/ferrite")))?;
    Some(root.join("kernels"))
}

/// What the PTX depends on: the source, the defines, the architecture, this build and NVRTC's
/// version.
fn ptx_key(source: KernelSource, arch: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source.src, kernels::defines(), arch, env!("CARGO_PKG_VERSION")).hash(&mut h);
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints through the pointers, which address live locals.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor).hash(&mut h);
    h.finish()
}

/// Writes `bytes` to `path` through a temporary file, so that a concurrent reader sees the old
/// file or the whole new one.
fn store_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("ptx"), std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// One kernel module as PTX for virtual architecture `arch`, with the constants it shares with
/// Rust defined.
fn compile_ptx(source: KernelSource, arch: &'static str) -> Result<Ptx> {
    let opts = CompileOptions { arch: Some(arch), options: kernels::defines(), ..Default::default() };
    compile_ptx_with_opts(source.src, opts)
        .map_err(|e| dev_err(format!("NVRTC failed on the {} kernels for {arch}: {e:?}", source.name)))
}

/// Stream-ordered allocations return freed memory to the driver at every synchronisation by
/// default; keeping it in the pool makes per-op output allocation cheap after the first step.
fn keep_pool_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: drv_sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: plain driver calls on this context's device with valid out-pointers.
    unsafe {
        drv_sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().map_err(dev_err)?;
        drv_sys::cuMemPoolSetAttribute(
            pool,
            drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        )
        .result()
        .map_err(dev_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::attention::{AttnItem, DecodeItem};
    use crate::cuda::sampling::SamplePlan;

    /// `static_assert`s that the C struct of the same name has the size and field offsets of
    /// the Rust one. NVRTC has no `<cstddef>`; `__INTADDR__` is how its front end defines
    /// `offsetof`.
    macro_rules! layout {
        ($ty:ident { $($field:ident),+ $(,)? }) => {{
            let name = stringify!($ty);
            let mut asserts = format!("static_assert(sizeof({name}) == {});\n", std::mem::size_of::<$ty>());
            $(asserts += &format!(
                "static_assert(__INTADDR__(&(({name}*)0)->{}) == {});\n",
                stringify!($field),
                std::mem::offset_of!($ty, $field),
            );)+
            asserts
        }};
    }

    /// A compiled module is written to the kernel cache and read back from it on the next
    /// use (the file's content is what loads, so a planted marker shows the cache was read).
    #[test]
    fn compiled_ptx_goes_through_the_kernel_cache() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12, then LD_LIBRARY_PATH)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ferrite-kernel-cache-{}", std::process::id()));
        let source = kernels::SAMPLING;
        let first = cached_ptx_in(Some(&dir), source, "compute_90").unwrap().to_src();
        let files: Vec<_> = std::fs::read_dir(dir.join("")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), first);
        std::fs::write(&files[0], format!("// from the cache\n{first}")).unwrap();
        let second = cached_ptx_in(Some(&dir), source, "compute_90").unwrap().to_src();
        assert!(second.starts_with("// from the cache"), "the cache was not read");
        // Another architecture is another entry.
        cached_ptx_in(Some(&dir), source, "compute_89").unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// NVRTC needs no GPU: where only the library is present (CI installs its wheel), every
    /// kernel module is still compiled for Hopper, so that a kernel that does not build fails
    /// here rather than at a server's start on the device.
    #[test]
    fn every_kernel_module_compiles_for_sm90() {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12, then LD_LIBRARY_PATH)");
            return;
        }
        let mut ptx_of = HashMap::new();
        for source in kernels::modules() {
            let ptx = compile_ptx(source, "compute_90").unwrap_or_else(|e| panic!("{e}")).to_src();
            assert!(ptx.contains(".entry"), "{} kernels gave no entry points", source.name);
            assert!(ptx_of.insert(source.name, ptx).is_none(), "two modules named {}", source.name);
        }
        // The launchers find a split family's kernel in the module the lookup names.
        let has = |source: Option<KernelSource>, kernel: &str| {
            let source = source.unwrap_or_else(|| panic!("no module for {kernel}"));
            assert!(ptx_of[source.name].contains(&format!(".entry {kernel}(")), "{kernel} is not in {}", source.name);
        };
        for cache in ["", "_fp8"] {
            for (t, dvr, hm) in ["f32", "bf16"]
                .into_iter()
                .flat_map(|t| [4, 8].map(|v| (t, v)))
                .flat_map(|(t, v)| [1, 2, 4, 8].map(|h| (t, v, h)))
            {
                has(kernels::attention_decode(t, cache, dvr), &format!("paged_decode_{t}{cache}_h{hm}_v{dvr}"));
            }
            for d in crate::cuda::attention::MMA_HEAD_DIMS {
                has(kernels::attention_fa2(d), &format!("paged_attn_fa2_bf16{cache}_d{d}"));
            }
        }
        // The structs the kernels read from buffers that Rust fills: NVRTC checks that the C
        // declarations have the Rust size and field offsets.
        let attention = concat!(include_str!("kernels/common.cuh"), include_str!("kernels/attention_common.cuh"));
        let probes = [
            (
                "attention items",
                attention,
                layout!(AttnItem { row0, nrows, pos0, h0, nheads, bt_off, k_lo, k_hi, local0, last })
                    + &layout!(DecodeItem { row, local, h0, nheads, bt_off, k_lo, k_hi, pad }),
            ),
            (
                "sample plan",
                kernels::SAMPLING.src,
                layout!(SamplePlan { greedy, inv_t, log_min_p, top_p, top_k, seed_lo, seed_hi, step_lo, step_hi }),
            ),
        ];
        for (name, src, asserts) in probes {
            let src: &'static str = Box::leak(format!("{src}\n{asserts}").into_boxed_str());
            compile_ptx(KernelSource { name, src }, "compute_90").unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
