"""tscale._C sign packing against its torch reference, on random data."""

import pytest
import torch

from tscale.ops import bitpack, kernels_available

pytestmark = pytest.mark.skipif(not kernels_available(), reason="tscale._C is not built")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,chunk", [(1, 8), (13, 8), (4096, 256), (100_003, 1024), (65_536, 65_536)])
def test_pack_matches_reference(device, n, chunk):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g) * torch.rand(n, generator=g) * 3).to(device)
    bits, scales = torch.ops.tscale.pack_signs(x, chunk)
    ref_bits, ref_scales = bitpack.pack_signs_reference(x, chunk)
    assert torch.equal(bits, ref_bits)
    torch.testing.assert_close(scales, ref_scales, rtol=1e-5, atol=1e-7)

    out = torch.ops.tscale.unpack_signs(bits, scales, n, chunk)
    torch.testing.assert_close(out, bitpack.unpack_signs_reference(bits, scales, n, chunk))
    assert torch.equal(out >= 0, x >= 0)

    acc = torch.randn(n, generator=g).to(device)
    expected = acc + out
    torch.ops.tscale.unpack_signs_accumulate_(acc, bits, scales, chunk)
    torch.testing.assert_close(acc, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,chunk", [(1, 8), (13, 8), (4096, 256), (100_003, 1024), (20_000, 2048)])
def test_pack_feedback_matches_reference(device, n, chunk):
    g = torch.Generator().manual_seed(n + 1)
    x = (torch.randn(n, generator=g) * torch.rand(n, generator=g) * 3).to(device)
    x[::7] = 0.0  # zero packs as +: its residual is -scale
    original, ref_x = x.clone(), x.clone()
    bits, scales = bitpack.pack_signs_feedback_(x, chunk)
    ref_bits, ref_scales = bitpack.pack_signs_feedback_reference(ref_x, chunk)
    assert torch.equal(bits, ref_bits)
    torch.testing.assert_close(scales, ref_scales, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(x, ref_x, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x + bitpack.unpack_signs_reference(bits, scales, n, chunk), original)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,added,chunk", [(16, 13, 8), (4096, 4096, 256), (100_352, 100_003, 1024), (20_480, 1, 2048)])
def test_pack_feedback_add_is_add_then_pack_feedback(device, n, added, chunk):
    g = torch.Generator().manual_seed(n + added)
    x = (torch.randn(n, generator=g) * torch.rand(n, generator=g)).to(device)
    add = (torch.randn(added, generator=g) * 2).to(device)
    ref_x = x.clone()
    ref_x[:added] += add
    ref_bits, ref_scales = bitpack.pack_signs_feedback_reference(ref_x, chunk)
    bits, scales = bitpack.pack_signs_feedback_add_(x, add, chunk)
    assert torch.equal(bits, ref_bits)
    torch.testing.assert_close(scales, ref_scales, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(x, ref_x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,chunk", [(13, 8), (4096, 256), (100_003, 1024)])
def test_unpack_into_overwrites(device, n, chunk):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).to(device)
    bits, scales = bitpack.pack_signs_reference(x, chunk)
    out = torch.full((n,), float("nan"), device=device)  # whatever was there must not matter
    bitpack.unpack_signs_into_(out, bits, scales, chunk)
    assert torch.equal(out, bitpack.unpack_signs_reference(bits, scales, n, chunk))


def test_pack_feedback_add_rejects_a_longer_addend():
    with pytest.raises(RuntimeError, match="more than"):
        torch.ops.tscale.pack_signs_feedback_add_(torch.zeros(8), torch.zeros(16), 8)


def test_pack_feedback_rejects_strided_input():
    x = torch.randn(64)[::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.tscale.pack_signs_feedback_(x, 8)


def test_reference_roundtrip_semantics():
    x = torch.tensor([1.0, -2.0, 0.0, -0.5, 3.0, 4.0, -1.0, 2.0, -8.0])
    bits, scales = bitpack.pack_signs_reference(x, 8)
    assert bits.tolist() == [0b10110101, 0b0]
    torch.testing.assert_close(scales, torch.tensor([13.5 / 8, 8.0]))
    out = bitpack.unpack_signs_reference(bits, scales, 9, 8)
    assert out.tolist()[:4] == [13.5 / 8, -13.5 / 8, 13.5 / 8, -13.5 / 8] and out[8].item() == -8.0


def test_kernel_rejects_bad_chunk():
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.tscale.pack_signs(torch.randn(16), 12)
    with pytest.raises(RuntimeError, match="scales"):
        torch.ops.tscale.unpack_signs(torch.zeros(2, dtype=torch.uint8), torch.ones(3), 16, 8)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@needs_cuda
def test_cuda_kernels_are_built_and_chosen():
    import tscale._C as ext

    assert ext.with_cuda, "a GPU is visible but tscale._C was built without CUDA kernels"
    x = torch.randn(10_000, device="cuda")
    bits, scales = bitpack.pack_signs(x, 2048)
    assert bits.is_cuda and scales.is_cuda and bitpack._use_kernel(x)
    ref_bits, ref_scales = bitpack.pack_signs_reference(x, 2048)
    assert torch.equal(bits, ref_bits)
    torch.testing.assert_close(scales, ref_scales, rtol=1e-5, atol=1e-7)


@needs_cuda
@pytest.mark.parametrize("chunk", [8, 256, 2048])
def test_cuda_unaligned_and_ragged(chunk):
    base = torch.randn(50_001, device="cuda")
    x = base[3:]  # storage offset 3: not 16-byte aligned; 49_998 values, ragged last byte and chunk
    bits, scales = torch.ops.tscale.pack_signs(x, chunk)
    ref_bits, ref_scales = bitpack.pack_signs_reference(x, chunk)
    assert torch.equal(bits, ref_bits)
    torch.testing.assert_close(scales, ref_scales, rtol=1e-5, atol=1e-7)
    out = torch.zeros(49_999, device="cuda")[1:]  # unaligned accumulation target, same length as x
    expected = out + bitpack.unpack_signs_reference(bits, scales, out.numel(), chunk)
    torch.ops.tscale.unpack_signs_accumulate_(out, bits, scales, chunk)
    torch.testing.assert_close(out, expected)
