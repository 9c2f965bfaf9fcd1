"""The epilogue of a GEMM run on integer codes elsewhere (``torch._int_mm``): y = acc * row scale * column
scale (+ bias), one pass over the int32 sums, fp32 math, cast to the output type."""
import triton
import triton.language as tl


@triton.jit
def scale_rows_cols_kernel(acc_ptr, xs_ptr, ws_ptr, b_ptr, y_ptr, M, N, stride_am, stride_ym,
                           HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    rows = offs_m.to(tl.int64)[:, None]
    acc = tl.load(acc_ptr + rows * stride_am + offs_n[None, :], mask=mask, other=0).to(tl.float32)
    xs = tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)
    ws = tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
