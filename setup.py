"""Builds the tscale package, the `tscale` command and the extension tscale._C.

The CPU sources under csrc/ always build; the CUDA sources (*.cu) build when a CUDA toolkit
and a CUDA build of torch are present, and then define TSCALE_WITH_CUDA. Install with
`pip install --no-build-isolation -e .` after torch (see the README).
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension


CUTLASS_SOURCES = "csrc/cutlass"  # their own module, tscale._C_cutlass (needs CUTLASS's headers)


def extensions() -> list:
    """tscale._C always; tscale._C_cutlass too where it can be built (see _cutlass_extension)."""
    main, with_cuda = extension()
    cutlass = _cutlass_extension() if with_cuda else None
    return [main, cutlass] if cutlass else [main]


def extension():
    """(tscale._C, whether it has the CUDA kernels)."""
    cpp_sources = sorted(p for p in glob.glob("csrc/**/*.cpp", recursive=True) if not p.startswith(CUTLASS_SOURCES))
    cuda_sources = sorted(p for p in glob.glob("csrc/**/*.cu", recursive=True) if not p.startswith(CUTLASS_SOURCES))
    with_cuda = bool(cuda_sources) and cpp_extension.CUDA_HOME is not None and _torch_has_cuda()
    if os.environ.get("TSCALE_NO_CUDA") == "1":
        with_cuda = False
    cxx_flags = ["-O3", "-fopenmp"]  # the C++ standard is the one torch.utils.cpp_extension picks for this torch
    if with_cuda:
        arch = _with_sm90a(os.environ.get("TORCH_CUDA_ARCH_LIST") or "8.0;8.6;8.9;9.0")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
        hopper = [("TSCALE_WITH_SM90A", "1")] if "9.0a" in arch.split(";") else []  # the wgmma kernels are built
        lt = _cublaslt()  # the fp8 / int8 GEMMs of csrc/fp8 (gemm_cublaslt.cu)
        return cpp_extension.CUDAExtension(
            "tscale._C",
            cpp_sources + cuda_sources,
            define_macros=[("TSCALE_WITH_CUDA", "1"), *hopper, *lt["define_macros"]],
            include_dirs=lt["include_dirs"],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--use_fast_math"]},
            extra_link_args=["-fopenmp", *lt["extra_link_args"]],
        ), True
    return cpp_extension.CppExtension("tscale._C", cpp_sources, extra_compile_args=cxx_flags,
                                      extra_link_args=["-fopenmp"]), False


def _with_sm90a(arch_list: str) -> str:
    """"8.0;9.0" -> "8.0;9.0a": Hopper as sm_90a, whose wgmma instructions the attention kernels use (its code
    runs on every sm_90 GPU); "9.0+PTX" keeps its PTX beside it."""
    out = []
    for item in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        item = item.strip()
        if item in ("9.0", "9.0+PTX"):
            out.append("9.0a")
            if item.endswith("+PTX"):
                out.append(item)
        elif item and item not in out:
            out.append(item)
    return ";".join(dict.fromkeys(out))


def _cutlass_extension():
    """tscale._C_cutlass: int8 products with their scales in the epilogue, from CUTLASS's headers.

    Built when CUTLASS is found: TSCALE_CUTLASS_DIR (a CUTLASS checkout or its include folder)
    or the pip package nvidia-cutlass (`pip install nvidia-cutlass`, headers only);
    TSCALE_NO_CUTLASS=1 skips it. Compiled for the architectures of TORCH_CUDA_ARCH_LIST from 8.0
    up, with 9.0 as sm_90a (the Hopper kernel's wgmma needs it). Without the module int8 products
    take cuBLASLt's int32 output and a scaling pass. TSCALE_CUTLASS_CANDIDATES=1 adds the Hopper
    kernel's other configurations (int8_gemm_sm90_candidates.cu) for scripts/bench/lowprec_gemm.py.
    """
    if os.environ.get("TSCALE_NO_CUTLASS") == "1":
        return None
    arches = _cutlass_arches(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    include = _cutlass_include()
    if include is None or not arches:
        print("setup.py: CUTLASS not found (pip install nvidia-cutlass, or TSCALE_CUTLASS_DIR) or no architecture "
              "from 8.0 up; building without the CUTLASS int8 products")
        return None
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in arches]
    candidates = os.environ.get("TSCALE_CUTLASS_CANDIDATES") == "1" and "90a" in arches  # other configs, to time
    return cpp_extension.CUDAExtension(
        "tscale._C_cutlass",
        sorted(glob.glob(f"{CUTLASS_SOURCES}/*.cpp") + [f for f in glob.glob(f"{CUTLASS_SOURCES}/*.cu")
                                                         if candidates or not f.endswith("_candidates.cu")]),
        include_dirs=include,
        extra_compile_args={"cxx": ["-O3"],
                            "nvcc": ["-O3", "-DNDEBUG", "--expt-relaxed-constexpr", *gencode]},
    )


def _cutlass_arches(arch_list: str) -> list[str]:
    """"8.0;8.9;9.0+PTX" -> ["80", "89", "90a"]: the architectures from 8.0 up, Hopper as sm_90a."""
    out = []
    for item in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        item = item.split("+")[0].strip().rstrip("a")
        if not item or "." not in item:
            continue
        major, minor = item.split(".", 1)
        if int(major) >= 8 and f"{major}{minor}" not in [a.rstrip("a") for a in out]:
            out.append(f"{major}{minor}a" if (major, minor) == ("9", "0") else f"{major}{minor}")
    return out


def _cutlass_include() -> list[str] | None:
    """CUTLASS's include folders (cutlass/, cute/ and the util headers), or None."""
    import importlib.util

    roots = []
    if os.environ.get("TSCALE_CUTLASS_DIR"):
        roots.append(os.environ["TSCALE_CUTLASS_DIR"])
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        roots.append(os.path.join(list(spec.submodule_search_locations)[0], "source"))
    for root in roots:
        for include in (os.path.join(root, "include"), root):
            if os.path.isfile(os.path.join(include, "cutlass", "cutlass.h")):
                util = os.path.join(os.path.dirname(include), "tools", "util", "include")
                if os.path.isfile(os.path.join(util, "cutlass", "util", "packed_stride.hpp")):
                    return [include, util]
    return None


def _cublaslt() -> dict:
    """Compile and link arguments for cuBLASLt, found in CUDA_HOME or in pip's nvidia/cu13 (nvidia/cublas) package.

    A full toolkit has include/cublasLt.h and lib64/libcublasLt.so; the pip package (what a CUDA
    build of torch installs) has only the versioned libcublasLt.so.N, so that one is linked by name.
    Not found: TSCALE_WITH_CUBLASLT stays undefined, the GEMM kernels are left out and tscale.ops
    uses torch's products instead.
    """
    roots = [cpp_extension.CUDA_HOME]
    try:
        import nvidia  # namespace package of the pip CUDA libraries

        roots += [os.path.join(base, sub) for base in nvidia.__path__ for sub in ("cu13", "cublas", "cu12")]
    except ImportError:
        pass
    for root in filter(None, roots):
        include = os.path.join(root, "include")
        if not os.path.isfile(os.path.join(include, "cublasLt.h")):
            continue
        for libdir in (os.path.join(root, "lib64"), os.path.join(root, "lib")):
            names = sorted((os.path.basename(p) for p in glob.glob(os.path.join(libdir, "libcublasLt.so*"))), key=len)
            if names:
                lib = "-lcublasLt" if names[0] == "libcublasLt.so" else f"-l:{names[0]}"
                return {"define_macros": [("TSCALE_WITH_CUBLASLT", "1")], "include_dirs": [include],
                        "extra_link_args": [f"-L{libdir}", lib, f"-Wl,-rpath,{libdir}"]}
    print("setup.py: cuBLASLt not found; building without the fp8 / int8 GEMM kernels")
    return {"define_macros": [], "include_dirs": [], "extra_link_args": []}


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None


setup(
    name="tscale",
    version="0.1.0",
    description="Train and run transformer language models on GPUs people can own",
    python_requires=">=3.11",
    packages=find_packages(include=["tscale", "tscale.*"]) + ["tscale.cli"],
    package_dir={"tscale.cli": "cli"},
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    install_requires=[
        "torch>=2.11",
        "numpy",
        "click>=8",
        "rich",
        "pydantic>=2",
        "tokenizers>=0.19",
        "safetensors",
        "matplotlib",
    ],
    # cuDNN's attention for train.attention = "cudnn" / "cudnn_global" on Hopper and newer
    # (tscale/ops/attention_cudnn.py); the version whose graph API the module was checked with
    extras_require={"hopper": ["nvidia-cudnn-frontend>=1.32"]},
    entry_points={"console_scripts": ["tscale=tscale.cli.main:main"]},
)
