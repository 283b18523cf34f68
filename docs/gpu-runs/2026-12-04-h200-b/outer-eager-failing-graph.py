# AOT ID: ['11_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/uq/cuqguckpwqkwsyniveq5jp7eose4isnim267ncftrkfdnbwjcvj4.py
# Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, mul_3], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
# Source node to ATen node mapping:
#   _to_copy_3 => convert_element_type_3
#   _to_copy_4 => convert_element_type_4
#   add_1 => add_69
#   mean => mean
#   mul_2 => mul_77
#   mul_3 => mul_84
#   pow_1 => pow_1
#   rsqrt => rsqrt
# Graph fragment:
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %arg0_1 : Tensor "bf16[4096][1]cuda:0" = PlaceHolder[target=arg0_1]
#   %buf0 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf0]
#   %arg6_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg6_1]
#   %convert_element_type_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg5_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 2), kwargs = {})
#   %mean : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   %add_69 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean, %arg6_1), kwargs = {})
#   %rsqrt : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_69,), kwargs = {})
#   %mul_77 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_3, %rsqrt), kwargs = {})
#   %convert_element_type_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_77, torch.bfloat16), kwargs = {})
#   %mul_84 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%arg0_1, %convert_element_type_4), kwargs = {})
#   return %buf0,%mul_84
triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0 = async_compile.triton('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': 'fp32', 'out_ptr0': '*fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 4, 'num_store': 2, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 25, 'r0_': 131072}}
)
@triton.jit
def triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp4 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tmp0.to(tl.float32)
        tmp2 = tmp1 * tmp1
        tmp3 = tl.broadcast_to(tmp2, [XBLOCK, R0_BLOCK])
        tmp5 = _tmp4 + tmp3
        _tmp4 = tl.where(r0_mask & xmask, tmp5, _tmp4)
    tmp4 = tl.sum(_tmp4, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp4, xmask)
    tmp11 = in_ptr2
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp6 = tl.load(in_ptr1 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp7 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp8 = tmp7.to(tl.float32)
        tmp9 = tl.full([1, 1], 4096.0, tl.float32)
        tmp10 = (tmp4 / tmp9)
        tmp12 = tmp10 + tmp11
        tmp13 = libdevice.rsqrt(tmp12)
        tmp14 = tmp8 * tmp13
        tmp15 = tmp14.to(tl.float32)
        tmp16 = tmp6 * tmp15
        tl.store(out_ptr1 + (r0_1 + 4096*x0), tmp16, r0_mask & xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/7c/c7c7cyyv4gqhxyptrl6lkzldyz4xjgcs2tarhzrxultmrlqqokie.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean]
# Source node to ATen node mapping:
#   _to_copy_5 => convert_element_type_7
#   mean_1 => mean_1
#   pow_2 => pow_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %mm : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   return %buf3
triton_per_fused__to_copy_mean_pow_view_1 = async_compile.triton('triton_per_fused__to_copy_mean_pow_view_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 256, 'r0_': 128},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy_mean_pow_view_1', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 1280, 'r0_': 40960}}
)
@triton.jit
def triton_per_fused__to_copy_mean_pow_view_1(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    r0_numel = 128
    R0_BLOCK: tl.constexpr = 128
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 128*x0), xmask, other=0.0).to(tl.float32)
    tmp1 = tmp0.to(tl.float32)
    tmp2 = tmp1 * tmp1
    tmp3 = tl.broadcast_to(tmp2, [XBLOCK, R0_BLOCK])
    tmp5 = tl.where(xmask, tmp3, 0)
    tmp6 = tl.sum(tmp5, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp6, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/cc/cccfa6xifxp36ynrqemq4bg6y7n4tqzxvylq3k4ts5kgudn6hnq5.py
# Topologically Sorted Source Nodes: [add, unsqueeze, unsqueeze_1, _to_copy], Original ATen: [aten.add, aten.unsqueeze, aten._to_copy]
# Source node to ATen node mapping:
#   _to_copy => convert_element_type
#   add => add
#   unsqueeze => unsqueeze
#   unsqueeze_1 => unsqueeze_1
# Graph fragment:
#   %arg26_1 : Tensor "i64[s55][1]cuda:0" = PlaceHolder[target=arg26_1]
#   %add : Tensor "i64[s55][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%arg26_1, 0), kwargs = {})
#   %unsqueeze : Tensor "i64[1, s55][s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%add, 0), kwargs = {})
#   %unsqueeze_1 : Tensor "i64[1, 1, s55][s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%unsqueeze, 1), kwargs = {})
#   %convert_element_type : Tensor "f32[1, 1, s55][s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%unsqueeze_1, torch.float32), kwargs = {})
#   return %expand
triton_poi_fused__to_copy_add_unsqueeze_2 = async_compile.triton('triton_poi_fused__to_copy_add_unsqueeze_2', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 8}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*i64', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_unsqueeze_2', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 50}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_unsqueeze_2(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tl.full([1], 0, tl.int64)
    tmp2 = tmp0 + tmp1
    tmp3 = tmp2.to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp3, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/gm/cgmrqetqzep4ftkkmoasbl2dkxbfreunsuqcusssazy75dtpl4gl.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, mul_5, permute_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, slice_3, neg, slice_2, cat, sin, mul_1, _to_copy_2, unsqueeze_4, mul_7], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.permute, aten.bmm, aten.unsqueeze, aten.expand, aten.clone, aten.slice, aten.neg, aten.cat, aten.sin]
# Source node to ATen node mapping:
#   _to_copy_2 => convert_element_type_2
#   _to_copy_5 => convert_element_type_7
#   _to_copy_6 => convert_element_type_8
#   add_2 => add_113
#   bmm => unsqueeze_default
#   cat => cat
#   clone => clone
#   expand_1 => expand_1
#   mean_1 => mean_1
#   mul_1 => mul_53
#   mul_4 => mul_116
#   mul_5 => mul_123
#   mul_7 => mul_155
#   neg => neg
#   permute => permute
#   permute_1 => permute_1
#   pow_2 => pow_2
#   rsqrt_1 => rsqrt_1
#   sin => sin
#   slice_2 => slice_2
#   slice_3 => slice_3
#   unsqueeze_2 => unsqueeze_2
#   unsqueeze_4 => unsqueeze_4
#   view_2 => view_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %arg1_1 : Tensor "bf16[128][1]cuda:0" = PlaceHolder[target=arg1_1]
#   %mm : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm]
#   %buf3 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 32*s55]cuda:0" = PlaceHolder[target=buf3]
#   %arg8_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg8_1]
#   %mm_default : Tensor "f32[64, s55][s55, 1]cuda:0" = PlaceHolder[target=mm_default]
#   %arg28_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg28_1]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_113 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, %arg8_1), kwargs = {})
#   %rsqrt_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_113,), kwargs = {})
#   %mul_116 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_7, %rsqrt_1), kwargs = {})
#   %convert_element_type_8 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_116, torch.bfloat16), kwargs = {})
#   %mul_123 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%arg1_1, %convert_element_type_8), kwargs = {})
#   %permute_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.permute.default](args = (%mul_123, [0, 2, 1, 3]), kwargs = {})
#   %unsqueeze_default : Tensor "f32[1, 64, s55][64*s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%mm_default, 0), kwargs = {})
#   %permute : Tensor "f32[1, s55, 64][64*s55, 1, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%unsqueeze_default, [0, 2, 1]), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[1, s55, 1, 64][64*s55, 1, 64*s55, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%permute, 2), kwargs = {})
#   %expand_1 : Tensor "f32[1, s55, 2, 64][64*s55, 1, 0, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%unsqueeze_2, [1, %arg31_1, 2, 64]), kwargs = {})
#   %clone : Tensor "f32[1, s55, 2, 64][128*s55, 128, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%expand_1,), kwargs = {memory_format: torch.contiguous_format})
#   %view_2 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%clone, [1, %arg31_1, 128]), kwargs = {})
#   %slice_3 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%permute_1, 3, 64, 9223372036854775807), kwargs = {})
#   %neg : Tensor "bf16[1, 32, s55, 64][2048*s55, 64, 2048, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%slice_3,), kwargs = {})
#   %slice_2 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%permute_1, 3, 0, 64), kwargs = {})
#   %cat : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cat.default](args = ([%neg, %slice_2], -1), kwargs = {})
#   %sin : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sin.default](args = (%view_2,), kwargs = {})
#   %mul_53 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%sin, %arg28_1), kwargs = {})
#   %convert_element_type_2 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_53, torch.bfloat16), kwargs = {})
#   %unsqueeze_4 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_2, 1), kwargs = {})
#   %mul_155 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%cat, %unsqueeze_4), kwargs = {})
#   return %mul_155
triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3 = async_compile.triton('triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'y': 128, 'x': 256}, tile_hint=TileHint.DEFAULT,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': 'fp32', 'in_ptr4': '*fp32', 'in_ptr5': 'fp32', 'out_ptr0': '*bf16', 'ks0': 'i64', 'ynumel': 'i32', 'xnumel': 'i32', 'YBLOCK': 'constexpr', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid2D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 10, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'y': 82432, 'x': 82560}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, out_ptr0, ks0, ynumel, xnumel, YBLOCK : tl.constexpr, XBLOCK : tl.constexpr):
    ynumel = 128
    yoffset = tl.program_id(1) * YBLOCK
    yindex = yoffset + tl.arange(0, YBLOCK)[:, None]
    ymask = yindex < ynumel
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[None, :]
    xmask = xindex < xnumel
    y0 = yindex
    x3 = xindex
    x2 = xindex // 32
    tmp38 = tl.load(in_ptr4 + (x2 + ks0*((y0 % 64))), xmask & ymask, eviction_policy='evict_last')
    tmp40 = in_ptr5
    tmp0 = y0
    tmp1 = tl.full([1, 1], 0, tl.int64)
    tmp2 = tmp0 >= tmp1
    tmp3 = tl.full([1, 1], 64, tl.int64)
    tmp4 = tmp0 < tmp3
    tmp5 = tl.load(in_ptr0 + (tl.broadcast_to(64 + (y0), [YBLOCK, XBLOCK])), tmp4 & xmask & ymask, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp6 = tl.load(in_ptr1 + (64 + 128*x3 + (y0)), tmp4 & xmask & ymask, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp7 = tmp6.to(tl.float32)
    tmp8 = tl.load(in_ptr2 + (tl.broadcast_to(x3, [YBLOCK, XBLOCK])), tmp4 & xmask & ymask, eviction_policy='evict_last', other=0.0)
    tmp9 = tl.full([1, 1], 128.0, tl.float32)
    tmp10 = (tmp8 / tmp9)
    tmp11 = in_ptr3
    tmp12 = tmp10 + tmp11
    tmp13 = libdevice.rsqrt(tmp12)
    tmp14 = tmp7 * tmp13
    tmp15 = tmp14.to(tl.float32)
    tmp16 = tmp5 * tmp15
    tmp17 = -tmp16
    tmp18 = tl.full(tmp17.shape, 0.0, tmp17.dtype)
    tmp19 = tl.where(tmp4, tmp17, tmp18)
    tmp20 = tmp0 >= tmp3
    tmp21 = tl.full([1, 1], 128, tl.int64)
    tmp22 = tmp0 < tmp21
    tmp23 = tl.load(in_ptr0 + (tl.broadcast_to((-64) + y0, [YBLOCK, XBLOCK])), tmp20 & xmask & ymask, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp24 = tl.load(in_ptr1 + (128*x3 + ((-64) + y0)), tmp20 & xmask & ymask, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp25 = tmp24.to(tl.float32)
    tmp26 = tl.load(in_ptr2 + (tl.broadcast_to(x3, [YBLOCK, XBLOCK])), tmp20 & xmask & ymask, eviction_policy='evict_last', other=0.0)
    tmp27 = tl.full([1, 1], 128.0, tl.float32)
    tmp28 = (tmp26 / tmp27)
    tmp29 = in_ptr3
    tmp30 = tmp28 + tmp29
    tmp31 = libdevice.rsqrt(tmp30)
    tmp32 = tmp25 * tmp31
    tmp33 = tmp32.to(tl.float32)
    tmp34 = tmp23 * tmp33
    tmp35 = tl.full(tmp34.shape, 0.0, tmp34.dtype)
    tmp36 = tl.where(tmp20, tmp34, tmp35)
    tmp37 = tl.where(tmp4, tmp19, tmp36)
    tmp39 = tl_math.sin(tmp38)
    tmp41 = tmp39 * tmp40
    tmp42 = tmp41.to(tl.float32)
    tmp43 = tmp37 * tmp42
    tl.store(out_ptr0 + (x3 + 32*ks0*y0), tmp43, xmask & ymask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ss/css7ljfgmcprjlqefzqasjfqwirmvgp532hpyrawbfevcyizvcrb.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, mul_5, permute_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, mul_6, add_3], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.permute, aten.bmm, aten.unsqueeze, aten.expand, aten.clone, aten.cos]
# Source node to ATen node mapping:
#   _to_copy_1 => convert_element_type_1
#   _to_copy_5 => convert_element_type_7
#   _to_copy_6 => convert_element_type_8
#   add_2 => add_113
#   add_3 => add_167
#   bmm => unsqueeze_default
#   clone => clone
#   cos => cos
#   expand_1 => expand_1
#   mean_1 => mean_1
#   mul => mul_46
#   mul_4 => mul_116
#   mul_5 => mul_123
#   mul_6 => mul_138
#   permute => permute
#   permute_1 => permute_1
#   pow_2 => pow_2
#   rsqrt_1 => rsqrt_1
#   unsqueeze_2 => unsqueeze_2
#   unsqueeze_3 => unsqueeze_3
#   view_2 => view_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %arg1_1 : Tensor "bf16[128][1]cuda:0" = PlaceHolder[target=arg1_1]
#   %mm : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm]
#   %buf3 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 32*s55]cuda:0" = PlaceHolder[target=buf3]
#   %arg8_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg8_1]
#   %mm_default : Tensor "f32[64, s55][s55, 1]cuda:0" = PlaceHolder[target=mm_default]
#   %arg25_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg25_1]
#   %mul_155 : Tensor "bf16[1, 32, s55, 128][4096*s55, 1, 32, 32*s55]cuda:0" = PlaceHolder[target=mul_155]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_113 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, %arg8_1), kwargs = {})
#   %rsqrt_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_113,), kwargs = {})
#   %mul_116 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_7, %rsqrt_1), kwargs = {})
#   %convert_element_type_8 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_116, torch.bfloat16), kwargs = {})
#   %mul_123 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%arg1_1, %convert_element_type_8), kwargs = {})
#   %permute_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.permute.default](args = (%mul_123, [0, 2, 1, 3]), kwargs = {})
#   %unsqueeze_default : Tensor "f32[1, 64, s55][64*s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%mm_default, 0), kwargs = {})
#   %permute : Tensor "f32[1, s55, 64][64*s55, 1, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%unsqueeze_default, [0, 2, 1]), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[1, s55, 1, 64][64*s55, 1, 64*s55, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%permute, 2), kwargs = {})
#   %expand_1 : Tensor "f32[1, s55, 2, 64][64*s55, 1, 0, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%unsqueeze_2, [1, %arg31_1, 2, 64]), kwargs = {})
#   %clone : Tensor "f32[1, s55, 2, 64][128*s55, 128, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%expand_1,), kwargs = {memory_format: torch.contiguous_format})
#   %view_2 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%clone, [1, %arg31_1, 128]), kwargs = {})
#   %cos : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cos.default](args = (%view_2,), kwargs = {})
#   %mul_46 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%cos, %arg25_1), kwargs = {})
#   %convert_element_type_1 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_46, torch.bfloat16), kwargs = {})
#   %unsqueeze_3 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_1, 1), kwargs = {})
#   %mul_138 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%permute_1, %unsqueeze_3), kwargs = {})
#   %add_167 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_138, %mul_155), kwargs = {})
#   return %add_167
triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4 = async_compile.triton('triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'y': 256, 'x': 128}, tile_hint=TileHint.DEFAULT,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': 'fp32', 'in_ptr4': '*fp32', 'in_ptr5': 'fp32', 'in_ptr6': '*bf16', 'out_ptr0': '*bf16', 'ks0': 'i64', 'ynumel': 'i32', 'xnumel': 'i32', 'YBLOCK': 'constexpr', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid2D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 7, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'y': 41600, 'x': 123136}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, out_ptr0, ks0, ynumel, xnumel, YBLOCK : tl.constexpr, XBLOCK : tl.constexpr):
    xnumel = 128
    yoffset = tl.program_id(1) * YBLOCK
    yindex = yoffset + tl.arange(0, YBLOCK)[:, None]
    ymask = yindex < ynumel
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[None, :]
    xmask = xindex < xnumel
    x2 = xindex
    y3 = yindex
    y1 = yindex // 32
    tmp0 = tl.load(in_ptr0 + (x2), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp1 = tl.load(in_ptr1 + (x2 + 128*y3), xmask & ymask, eviction_policy='evict_last').to(tl.float32)
    tmp3 = tl.load(in_ptr2 + (y3), ymask, eviction_policy='evict_last')
    tmp6 = in_ptr3
    tmp12 = tl.load(in_ptr4 + (y1 + ks0*((x2 % 64))), xmask & ymask, eviction_policy='evict_last')
    tmp14 = in_ptr5
    tmp18 = tl.load(in_ptr6 + (y3 + 32*ks0*x2), xmask & ymask, eviction_policy='evict_last').to(tl.float32)
    tmp2 = tmp1.to(tl.float32)
    tmp4 = tl.full([1, 1], 128.0, tl.float32)
    tmp5 = (tmp3 / tmp4)
    tmp7 = tmp5 + tmp6
    tmp8 = libdevice.rsqrt(tmp7)
    tmp9 = tmp2 * tmp8
    tmp10 = tmp9.to(tl.float32)
    tmp11 = tmp0 * tmp10
    tmp13 = tl_math.cos(tmp12)
    tmp15 = tmp13 * tmp14
    tmp16 = tmp15.to(tl.float32)
    tmp17 = tmp11 * tmp16
    tmp19 = tmp17 + tmp18
    tl.store(out_ptr0 + (x2 + 128*y3), tmp19, xmask & ymask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/jn/cjn47cpscztp5bkwxny763rvkqmiax2q3bhf4mqkaiqubbsqboj7.py
# Topologically Sorted Source Nodes: [view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, mul_8, _to_copy_8, mul_9], Original ATen: [aten.view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul]
# Source node to ATen node mapping:
#   _to_copy_7 => convert_element_type_11
#   _to_copy_8 => convert_element_type_12
#   add_4 => add_205
#   add_5 => add_218
#   mean_2 => mean_2
#   mul_8 => mul_209
#   mul_9 => mul_216
#   pow_3 => pow_3
#   rsqrt_2 => rsqrt_2
#   view_8 => view_8
# Graph fragment:
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %mm_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %arg3_1 : Tensor "bf16[4096][1]cuda:0" = PlaceHolder[target=arg3_1]
#   %buf12 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf12]
#   %arg13_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg13_1]
#   %view_8 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [1, %arg31_1, 4096]), kwargs = {})
#   %add_205 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%arg5_1, %view_8), kwargs = {})
#   %convert_element_type_11 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_205, torch.float32), kwargs = {})
#   %pow_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_11, 2), kwargs = {})
#   %mean_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_3, [-1], True), kwargs = {})
#   %add_218 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_2, %arg13_1), kwargs = {})
#   %rsqrt_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_218,), kwargs = {})
#   %mul_209 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_11, %rsqrt_2), kwargs = {})
#   %convert_element_type_12 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_209, torch.bfloat16), kwargs = {})
#   %mul_216 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%arg3_1, %convert_element_type_12), kwargs = {})
#   return %buf12,%mul_216
triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_5 = async_compile.triton('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_5', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*bf16', 'in_ptr3': 'fp32', 'out_ptr0': '*fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_5', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 6, 'num_store': 2, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 25, 'r0_': 172032}}
)
@triton.jit
def triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_5(in_ptr0, in_ptr1, in_ptr2, in_ptr3, out_ptr0, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp6 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 + tmp1
        tmp3 = tmp2.to(tl.float32)
        tmp4 = tmp3 * tmp3
        tmp5 = tl.broadcast_to(tmp4, [XBLOCK, R0_BLOCK])
        tmp7 = _tmp6 + tmp5
        _tmp6 = tl.where(r0_mask & xmask, tmp7, _tmp6)
    tmp6 = tl.sum(_tmp6, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp6, xmask)
    tmp15 = in_ptr3
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp8 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp9 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp10 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp11 = tmp9 + tmp10
        tmp12 = tmp11.to(tl.float32)
        tmp13 = tl.full([1, 1], 4096.0, tl.float32)
        tmp14 = (tmp6 / tmp13)
        tmp16 = tmp14 + tmp15
        tmp17 = libdevice.rsqrt(tmp16)
        tmp18 = tmp12 * tmp17
        tmp19 = tmp18.to(tl.float32)
        tmp20 = tmp8 * tmp19
        tl.store(out_ptr1 + (r0_1 + 4096*x0), tmp20, r0_mask & xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/kc/ckcd6oq4aark2jfja7oxjyirz2h4s3gqv6nackovpvolnjotswna.py
# Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, mul_10], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul]
# Source node to ATen node mapping:
#   _to_copy_10 => convert_element_type_16
#   _to_copy_9 => convert_element_type_15
#   add_6 => add_258
#   div => div
#   exp => exp
#   mul_10 => mul_255
#   neg_1 => neg_1
#   view_10 => view_10
#   view_12 => view_12
# Graph fragment:
#   %mm_2 : Tensor "bf16[s55, 12288][12288, 1]cuda:0" = PlaceHolder[target=mm_2]
#   %mm_3 : Tensor "bf16[s55, 12288][12288, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %view_10 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_2, [1, %arg31_1, 12288]), kwargs = {})
#   %convert_element_type_15 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_10, torch.float32), kwargs = {})
#   %neg_1 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%convert_element_type_15,), kwargs = {})
#   %exp : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%neg_1,), kwargs = {})
#   %add_258 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.add.Tensor](args = (%exp, 1), kwargs = {})
#   %div : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%convert_element_type_15, %add_258), kwargs = {})
#   %convert_element_type_16 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%div, torch.bfloat16), kwargs = {})
#   %view_12 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [1, %arg31_1, 12288]), kwargs = {})
#   %mul_255 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_16, %view_12), kwargs = {})
#   return %mul_255
triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6 = async_compile.triton('triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 65536}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 2, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 491520}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp8 = tl.load(in_ptr1 + (x0), None).to(tl.float32)
    tmp1 = tmp0.to(tl.float32)
    tmp2 = -tmp1
    tmp3 = libdevice.exp(tmp2)
    tmp4 = tl.full([1], 1.0, tl.float32)
    tmp5 = tmp3 + tmp4
    tmp6 = (tmp1 / tmp5)
    tmp7 = tmp6.to(tl.float32)
    tmp9 = tmp7 * tmp8
    tl.store(out_ptr0 + (x0), tmp9, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/hq/chqign3ityy6kyd3rsuccoo2bxcu2sxrobcn33ogn756hwcfhpk3.py
# Topologically Sorted Source Nodes: [view_16, mul_13, _to_copy_13, view_8, add_4, view_14, add_7, _to_copy_11, pow_4, mean_3, add_8, rsqrt_3, mul_16, mul_15, sum_2, mul_17, pow_5, mul_18, expand_2, div_1, pow_6, mul_19, mul_20, add_9, _to_copy_14], Original ATen: [aten.view, aten.mul, aten._to_copy, aten.add, aten.pow, aten.mean, aten.rsqrt, aten.sum, aten.expand, aten.div]
# Source node to ATen node mapping:
#   _to_copy_11 => convert_element_type_21
#   _to_copy_13 => convert_element_type_23
#   _to_copy_14 => convert_element_type_24
#   add_4 => add_205
#   add_7 => add_289
#   add_8 => add_302
#   add_9 => add_378
#   div_1 => div_1
#   expand_2 => expand_2
#   mean_3 => mean_3
#   mul_13 => mul_305
#   mul_15 => mul_316
#   mul_16 => mul_320
#   mul_17 => mul_330
#   mul_18 => mul_333
#   mul_19 => mul_344
#   mul_20 => mul_348
#   pow_4 => pow_4
#   pow_5 => pow_5
#   pow_6 => pow_6
#   rsqrt_3 => rsqrt_3
#   sum_2 => sum_2
#   view_14 => view_14
#   view_16 => view_16
#   view_8 => view_8
# Graph fragment:
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %mm_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %mm_4 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_4]
#   %arg33_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=arg33_1]
#   %arg4_1 : Tensor "bf16[4096][1]cuda:0" = PlaceHolder[target=arg4_1]
#   %buf18 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf18]
#   %arg17_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg17_1]
#   %sum_2 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=sum_2]
#   %view_16 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%arg33_1, [1, %arg31_1, 4096]), kwargs = {})
#   %mul_305 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_16, %arg4_1), kwargs = {})
#   %convert_element_type_23 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_305, torch.float32), kwargs = {})
#   %view_8 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [1, %arg31_1, 4096]), kwargs = {})
#   %add_205 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%arg5_1, %view_8), kwargs = {})
#   %view_14 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_4, [1, %arg31_1, 4096]), kwargs = {})
#   %add_289 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_205, %view_14), kwargs = {})
#   %convert_element_type_21 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_289, torch.float32), kwargs = {})
#   %pow_4 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_21, 2), kwargs = {})
#   %mean_3 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_4, [-1], True), kwargs = {})
#   %add_302 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_3, %arg17_1), kwargs = {})
#   %rsqrt_3 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_302,), kwargs = {})
#   %mul_320 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_23, %rsqrt_3), kwargs = {})
#   %mul_316 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_23, %convert_element_type_21), kwargs = {})
#   %sum_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_316, [2], True), kwargs = {})
#   %mul_330 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_2, -0.5), kwargs = {})
#   %pow_5 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt_3, 3), kwargs = {})
#   %mul_333 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_330, %pow_5), kwargs = {})
#   %expand_2 : Tensor "f32[1, s55, 4096][s55, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_333, [1, %arg31_1, 4096]), kwargs = {})
#   %div_1 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand_2, 4096), kwargs = {})
#   %pow_6 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_21, 1.0), kwargs = {})
#   %mul_344 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_6, 2.0), kwargs = {})
#   %mul_348 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div_1, %mul_344), kwargs = {})
#   %add_378 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_320, %mul_348), kwargs = {})
#   %convert_element_type_24 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_378, torch.bfloat16), kwargs = {})
#   return %buf18,%sum_2,%convert_element_type_24
triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_7 = async_compile.triton('triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_7', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*bf16', 'in_ptr3': '*bf16', 'in_ptr4': '*bf16', 'in_ptr5': 'fp32', 'out_ptr0': '*fp32', 'out_ptr2': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_7', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 11, 'num_store': 2, 'num_reduction': 2, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 25, 'r0_': 253952}}
)
@triton.jit
def triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_7(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, out_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp8 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    _tmp16 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp3 = tl.load(in_ptr2 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp10 = tl.load(in_ptr3 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp11 = tl.load(in_ptr4 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 + tmp1
        tmp4 = tmp2 + tmp3
        tmp5 = tmp4.to(tl.float32)
        tmp6 = tmp5 * tmp5
        tmp7 = tl.broadcast_to(tmp6, [XBLOCK, R0_BLOCK])
        tmp9 = _tmp8 + tmp7
        _tmp8 = tl.where(r0_mask & xmask, tmp9, _tmp8)
        tmp12 = tmp10 * tmp11
        tmp13 = tmp12.to(tl.float32)
        tmp14 = tmp13 * tmp5
        tmp15 = tl.broadcast_to(tmp14, [XBLOCK, R0_BLOCK])
        tmp17 = _tmp16 + tmp15
        _tmp16 = tl.where(r0_mask & xmask, tmp17, _tmp16)
    tmp8 = tl.sum(_tmp8, 1)[:, None]
    tmp16 = tl.sum(_tmp16, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp8, xmask)
    tmp24 = in_ptr5
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp18 = tl.load(in_ptr3 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp19 = tl.load(in_ptr4 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp35 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp36 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp38 = tl.load(in_ptr2 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp20 = tmp18 * tmp19
        tmp21 = tmp20.to(tl.float32)
        tmp22 = tl.full([1, 1], 4096.0, tl.float32)
        tmp23 = (tmp8 / tmp22)
        tmp25 = tmp23 + tmp24
        tmp26 = libdevice.rsqrt(tmp25)
        tmp27 = tmp21 * tmp26
        tmp28 = tl.full([1, 1], -0.5, tl.float32)
        tmp29 = tmp16 * tmp28
        tmp30 = tmp26 * tmp26
        tmp31 = tmp30 * tmp26
        tmp32 = tmp29 * tmp31
        tmp33 = tl.full([1, 1], 0.000244140625, tl.float32)
        tmp34 = tmp32 * tmp33
        tmp37 = tmp35 + tmp36
        tmp39 = tmp37 + tmp38
        tmp40 = tmp39.to(tl.float32)
        tmp41 = tl.full([1, 1], 2.0, tl.float32)
        tmp42 = tmp40 * tmp41
        tmp43 = tmp34 * tmp42
        tmp44 = tmp27 + tmp43
        tmp45 = tmp44.to(tl.float32)
        tl.store(out_ptr2 + (r0_1 + 4096*x0), tmp45, r0_mask & xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/z3/cz3w7w5hzsxpow2nla6cttg6hehnjoj73zxjhar37rgz7fzvfjd3.py
# Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, view_19, mul_23, mul_24, _to_copy_15, div_4, neg_2, div_2, div_3, mul_25, mul_26, neg_3, add_10, _to_copy_16], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul]
# Source node to ATen node mapping:
#   _to_copy_10 => convert_element_type_16
#   _to_copy_15 => convert_element_type_33
#   _to_copy_16 => convert_element_type_34
#   _to_copy_9 => convert_element_type_15
#   add_10 => add_440
#   add_6 => add_258
#   div => div
#   div_2 => div_2
#   div_3 => div_3
#   div_4 => div_4
#   exp => exp
#   mul_23 => mul_367
#   mul_24 => mul_371
#   mul_25 => mul_396
#   mul_26 => mul_406
#   neg_1 => neg_1
#   neg_2 => neg_2
#   neg_3 => neg_3
#   view_10 => view_10
#   view_12 => view_12
#   view_19 => view_19
# Graph fragment:
#   %mm_6 : Tensor "bf16[s55, 12288][12288, 1]cuda:0" = PlaceHolder[target=mm_6]
#   %mm_2 : Tensor "bf16[s55, 12288][12288, 1]cuda:0" = PlaceHolder[target=mm_2]
#   %mm_3 : Tensor "bf16[s55, 12288][12288, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %view_10 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_2, [1, %arg31_1, 12288]), kwargs = {})
#   %convert_element_type_15 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_10, torch.float32), kwargs = {})
#   %neg_1 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%convert_element_type_15,), kwargs = {})
#   %exp : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.exp.default](args = (%neg_1,), kwargs = {})
#   %add_258 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.add.Tensor](args = (%exp, 1), kwargs = {})
#   %div : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%convert_element_type_15, %add_258), kwargs = {})
#   %convert_element_type_16 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%div, torch.bfloat16), kwargs = {})
#   %view_12 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [1, %arg31_1, 12288]), kwargs = {})
#   %view_19 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_6, [1, %arg31_1, 12288]), kwargs = {})
#   %mul_367 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_19, %convert_element_type_16), kwargs = {})
#   %mul_371 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_19, %view_12), kwargs = {})
#   %convert_element_type_33 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_371, torch.float32), kwargs = {})
#   %div_4 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%convert_element_type_33, %add_258), kwargs = {})
#   %neg_2 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%convert_element_type_33,), kwargs = {})
#   %div_2 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%convert_element_type_15, %add_258), kwargs = {})
#   %div_3 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%div_2, %add_258), kwargs = {})
#   %mul_396 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%neg_2, %div_3), kwargs = {})
#   %mul_406 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_396, %exp), kwargs = {})
#   %neg_3 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%mul_406,), kwargs = {})
#   %add_440 : Tensor "f32[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%div_4, %neg_3), kwargs = {})
#   %convert_element_type_34 : Tensor "bf16[1, s55, 12288][12288*s55, 12288, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_440, torch.bfloat16), kwargs = {})
#   return %mul_367,%convert_element_type_34
triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8 = async_compile.triton('triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 65536}, 
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 860160}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8(in_out_ptr0, in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp1 = tl.load(in_ptr1 + (x0), None).to(tl.float32)
    tmp10 = tl.load(in_out_ptr0 + (x0), None).to(tl.float32)
    tmp2 = tmp1.to(tl.float32)
    tmp3 = -tmp2
    tmp4 = libdevice.exp(tmp3)
    tmp5 = tl.full([1], 1.0, tl.float32)
    tmp6 = tmp4 + tmp5
    tmp7 = (tmp2 / tmp6)
    tmp8 = tmp7.to(tl.float32)
    tmp9 = tmp0 * tmp8
    tmp11 = tmp0 * tmp10
    tmp12 = tmp11.to(tl.float32)
    tmp13 = (tmp12 / tmp6)
    tmp14 = -tmp12
    tmp15 = (tmp7 / tmp6)
    tmp16 = tmp14 * tmp15
    tmp17 = tmp16 * tmp4
    tmp18 = -tmp17
    tmp19 = tmp13 + tmp18
    tmp20 = tmp19.to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp9, None)
    tl.store(in_out_ptr0 + (x0), tmp20, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/y6/cy6gttpzwsxmruuhbjiyqu5xumudeznlmzesx33gzrzows552i6n.py
# Topologically Sorted Source Nodes: [view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, view_21, view_23, add_11, mul_29, _to_copy_17, mul_32, mul_31, sum_4, mul_33, pow_7, mul_34, expand_3, div_5, pow_8, mul_35, mul_36, add_12, _to_copy_18, add_13], Original ATen: [aten.view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul, aten.sum, aten.expand, aten.div]
# Source node to ATen node mapping:
#   _to_copy_17 => convert_element_type_39
#   _to_copy_18 => convert_element_type_40
#   _to_copy_7 => convert_element_type_11
#   add_11 => add_458
#   add_12 => add_507
#   add_13 => add_514
#   add_4 => add_205
#   add_5 => add_218
#   div_5 => div_5
#   expand_3 => expand_3
#   mean_2 => mean_2
#   mul_29 => mul_431
#   mul_31 => mul_442
#   mul_32 => mul_446
#   mul_33 => mul_456
#   mul_34 => mul_459
#   mul_35 => mul_470
#   mul_36 => mul_474
#   pow_3 => pow_3
#   pow_7 => pow_7
#   pow_8 => pow_8
#   rsqrt_2 => rsqrt_2
#   sum_4 => sum_4
#   view_21 => view_21
#   view_23 => view_23
#   view_8 => view_8
# Graph fragment:
#   %mm_8 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_8]
#   %mm_10 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_10]
#   %arg3_1 : Tensor "bf16[4096][1]cuda:0" = PlaceHolder[target=arg3_1]
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %mm_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %convert_element_type_24 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=convert_element_type_24]
#   %buf12 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf12]
#   %arg13_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg13_1]
#   %sum_4 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=sum_4]
#   %view_8 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [1, %arg31_1, 4096]), kwargs = {})
#   %add_205 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%arg5_1, %view_8), kwargs = {})
#   %convert_element_type_11 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_205, torch.float32), kwargs = {})
#   %pow_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_11, 2), kwargs = {})
#   %mean_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_3, [-1], True), kwargs = {})
#   %add_218 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_2, %arg13_1), kwargs = {})
#   %rsqrt_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_218,), kwargs = {})
#   %view_21 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_8, [1, %arg31_1, 4096]), kwargs = {})
#   %view_23 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_10, [1, %arg31_1, 4096]), kwargs = {})
#   %add_458 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%view_21, %view_23), kwargs = {})
#   %mul_431 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%add_458, %arg3_1), kwargs = {})
#   %convert_element_type_39 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_431, torch.float32), kwargs = {})
#   %mul_446 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_39, %rsqrt_2), kwargs = {})
#   %mul_442 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_39, %convert_element_type_11), kwargs = {})
#   %sum_4 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_442, [2], True), kwargs = {})
#   %mul_456 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_4, -0.5), kwargs = {})
#   %pow_7 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt_2, 3), kwargs = {})
#   %mul_459 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_456, %pow_7), kwargs = {})
#   %expand_3 : Tensor "f32[1, s55, 4096][s55, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_459, [1, %arg31_1, 4096]), kwargs = {})
#   %div_5 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand_3, 4096), kwargs = {})
#   %pow_8 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_11, 1.0), kwargs = {})
#   %mul_470 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_8, 2.0), kwargs = {})
#   %mul_474 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div_5, %mul_470), kwargs = {})
#   %add_507 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_446, %mul_474), kwargs = {})
#   %convert_element_type_40 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_507, torch.bfloat16), kwargs = {})
#   %add_514 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%convert_element_type_24, %convert_element_type_40), kwargs = {})
#   return %sum_4,%add_514
triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_9 = async_compile.triton('triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_9', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*bf16', 'in_ptr3': '*bf16', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'in_ptr6': '*fp32', 'in_ptr7': 'fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_9', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 13, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 12, 'r0_': 294912}}
)
@triton.jit
def triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_9(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, in_ptr7, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp12 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp3 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp6 = tl.load(in_ptr3 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp7 = tl.load(in_ptr4 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 + tmp1
        tmp4 = tmp2 * tmp3
        tmp5 = tmp4.to(tl.float32)
        tmp8 = tmp6 + tmp7
        tmp9 = tmp8.to(tl.float32)
        tmp10 = tmp5 * tmp9
        tmp11 = tl.broadcast_to(tmp10, [XBLOCK, R0_BLOCK])
        tmp13 = _tmp12 + tmp11
        _tmp12 = tl.where(r0_mask & xmask, tmp13, _tmp12)
    tmp12 = tl.sum(_tmp12, 1)[:, None]
    tmp21 = tl.load(in_ptr6 + (x0), xmask, eviction_policy='evict_last')
    tmp24 = in_ptr7
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp14 = tl.load(in_ptr5 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp15 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp16 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp18 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp35 = tl.load(in_ptr3 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp36 = tl.load(in_ptr4 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp17 = tmp15 + tmp16
        tmp19 = tmp17 * tmp18
        tmp20 = tmp19.to(tl.float32)
        tmp22 = tl.full([1, 1], 4096.0, tl.float32)
        tmp23 = (tmp21 / tmp22)
        tmp25 = tmp23 + tmp24
        tmp26 = libdevice.rsqrt(tmp25)
        tmp27 = tmp20 * tmp26
        tmp28 = tl.full([1, 1], -0.5, tl.float32)
        tmp29 = tmp12 * tmp28
        tmp30 = tmp26 * tmp26
        tmp31 = tmp30 * tmp26
        tmp32 = tmp29 * tmp31
        tmp33 = tl.full([1, 1], 0.000244140625, tl.float32)
        tmp34 = tmp32 * tmp33
        tmp37 = tmp35 + tmp36
        tmp38 = tmp37.to(tl.float32)
        tmp39 = tl.full([1, 1], 2.0, tl.float32)
        tmp40 = tmp38 * tmp39
        tmp41 = tmp34 * tmp40
        tmp42 = tmp27 + tmp41
        tmp43 = tmp42.to(tl.float32)
        tmp44 = tmp14 + tmp43
        tl.store(out_ptr1 + (r0_1 + 4096*x0), tmp44, r0_mask & xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/jo/cjosuj4btbbllc4f4q2pnt3hov2lyc7cpe3alurnfbl3eoxwqmlz.py
# Topologically Sorted Source Nodes: [squeeze, squeeze_1, view_26, view_27, permute_3, clone_2, causal_blocks_backward], Original ATen: [aten.squeeze, aten.view, aten.permute, aten.clone, streamfx.causal_blocks_backward]
# Source node to ATen node mapping:
#   causal_blocks_backward => causal_blocks_backward
#   clone_2 => clone_2
#   permute_3 => permute_15
#   squeeze => squeeze
#   squeeze_1 => squeeze_1
#   view_26 => view_26
#   view_27 => view_27
# Graph fragment:
#   %mm_12 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_12]
#   %squeeze : Tensor "bf16[1, 8, s73, 128][1024, 128, 1024, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.squeeze.dim](args = (%arg29_1, 2), kwargs = {})
#   %squeeze_1 : Tensor "bf16[1, 8, s73, 128][1024, 128, 1024, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.squeeze.dim](args = (%arg30_1, 2), kwargs = {})
#   %view_26 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_12, [1, %arg31_1, 4096]), kwargs = {})
#   %view_27 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_26, [1, %arg31_1, 32, 128]), kwargs = {})
#   %permute_15 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%view_27, [0, 2, 1, 3]), kwargs = {})
#   %clone_2 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%permute_15,), kwargs = {memory_format: torch.contiguous_format})
#   %causal_blocks_backward : [num_users=3] = call_function[target=torch.ops.streamfx.causal_blocks_backward.default](args = (cudnn, %clone_2, %add_167, %squeeze, %squeeze_1, %getitem, %getitem_1, 0.08838834764831845), kwargs = {})
#   return %buf29
triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10 = async_compile.triton('triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 32768}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'out_ptr0': '*bf16', 'ks0': 'i64', 'ks1': 'i64', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 122880}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10(in_ptr0, out_ptr0, ks0, ks1, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = (xindex % 128)
    x1 = ((xindex // 128) % ks0)
    x2 = xindex // ks1
    x3 = xindex
    tmp0 = tl.load(in_ptr0 + (x0 + 128*x2 + 4096*x1), None, eviction_policy='evict_last').to(tl.float32)
    tl.store(out_ptr0 + (x3), tmp0, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/7u/c7uaelwq7qtjk3bigirram7seyptszfpvjxpsizgntlasdsusass.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_43, _to_copy_19, mul_46, mul_45, sum_6, mul_47, pow_9, mul_48, expand_4, div_6, pow_10, mul_49, mul_50, add_16, _to_copy_20, clone_3], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.mul, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum, aten.div]
# Source node to ATen node mapping:
#   _to_copy_1 => convert_element_type_1
#   _to_copy_19 => convert_element_type_45
#   _to_copy_2 => convert_element_type_2
#   _to_copy_20 => convert_element_type_46
#   _to_copy_5 => convert_element_type_7
#   add_14 => add_584
#   add_15 => add_592
#   add_16 => add_661
#   add_2 => add_113
#   bmm => unsqueeze_default
#   clone => clone
#   clone_3 => clone_3
#   cos => cos
#   div_6 => div_6
#   expand_1 => expand_1
#   expand_4 => expand_4
#   mean_1 => mean_1
#   mul => mul_46
#   mul_1 => mul_53
#   mul_41 => mul_528
#   mul_42 => mul_553
#   mul_43 => mul_565
#   mul_45 => mul_579
#   mul_46 => mul_584
#   mul_47 => mul_598
#   mul_48 => mul_602
#   mul_49 => mul_615
#   mul_50 => mul_619
#   neg_4 => neg_4
#   permute => permute
#   permute_4 => permute_16
#   pow_10 => pow_10
#   pow_2 => pow_2
#   pow_9 => pow_9
#   rsqrt_1 => rsqrt_1
#   sin => sin
#   slice_5 => slice_5
#   slice_6 => slice_6
#   slice_backward_1 => full_default_1
#   slice_backward_2 => full_default_2
#   sum_6 => sum_6
#   unsqueeze_2 => unsqueeze_2
#   unsqueeze_3 => unsqueeze_3
#   unsqueeze_4 => unsqueeze_4
#   view_2 => view_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %getitem_2 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0" = PlaceHolder[target=getitem_2]
#   %mm_default : Tensor "f32[64, s55][s55, 1]cuda:0" = PlaceHolder[target=mm_default]
#   %arg28_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg28_1]
#   %arg25_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg25_1]
#   %add_592 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0" = PlaceHolder[target=add_592]
#   %arg1_1 : Tensor "bf16[128][1]cuda:0" = PlaceHolder[target=arg1_1]
#   %mm : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm]
#   %buf3 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 32*s55]cuda:0" = PlaceHolder[target=buf3]
#   %arg8_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg8_1]
#   %sum_6 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 32*s55]cuda:0" = PlaceHolder[target=sum_6]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_113 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, %arg8_1), kwargs = {})
#   %rsqrt_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_113,), kwargs = {})
#   %unsqueeze_default : Tensor "f32[1, 64, s55][64*s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%mm_default, 0), kwargs = {})
#   %permute : Tensor "f32[1, s55, 64][64*s55, 1, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%unsqueeze_default, [0, 2, 1]), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[1, s55, 1, 64][64*s55, 1, 64*s55, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%permute, 2), kwargs = {})
#   %expand_1 : Tensor "f32[1, s55, 2, 64][64*s55, 1, 0, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%unsqueeze_2, [1, %arg31_1, 2, 64]), kwargs = {})
#   %clone : Tensor "f32[1, s55, 2, 64][128*s55, 128, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%expand_1,), kwargs = {memory_format: torch.contiguous_format})
#   %view_2 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%clone, [1, %arg31_1, 128]), kwargs = {})
#   %cos : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cos.default](args = (%view_2,), kwargs = {})
#   %mul_46 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%cos, %arg25_1), kwargs = {})
#   %convert_element_type_1 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_46, torch.bfloat16), kwargs = {})
#   %unsqueeze_3 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_1, 1), kwargs = {})
#   %sin : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sin.default](args = (%view_2,), kwargs = {})
#   %mul_53 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%sin, %arg28_1), kwargs = {})
#   %convert_element_type_2 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_53, torch.bfloat16), kwargs = {})
#   %unsqueeze_4 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_2, 1), kwargs = {})
#   %full_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %mul_528 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_4), kwargs = {})
#   %slice_5 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 0, 64), kwargs = {})
#   %neg_4 : Tensor "bf16[1, 32, s55, 64][2048*s55, 64, 2048, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%slice_5,), kwargs = {})
#   %slice_scatter_default : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_1, %neg_4, 3, 64, 9223372036854775807), kwargs = {})
#   %full_default_2 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %slice_6 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 64, 128), kwargs = {})
#   %slice_scatter_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_2, %slice_6, 3, 0, 64), kwargs = {})
#   %add_584 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%slice_scatter_default, %slice_scatter_default_1), kwargs = {})
#   %mul_553 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_3), kwargs = {})
#   %add_592 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_584, %mul_553), kwargs = {})
#   %permute_16 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.permute.default](args = (%add_592, [0, 2, 1, 3]), kwargs = {})
#   %mul_565 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%permute_16, %arg1_1), kwargs = {})
#   %convert_element_type_45 : Tensor "f32[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_565, torch.float32), kwargs = {})
#   %mul_584 : Tensor "f32[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_45, %rsqrt_1), kwargs = {})
#   %mul_579 : Tensor "f32[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_45, %convert_element_type_7), kwargs = {})
#   %sum_6 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_579, [3], True), kwargs = {})
#   %mul_598 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_6, -0.5), kwargs = {})
#   %pow_9 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt_1, 3), kwargs = {})
#   %mul_602 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_598, %pow_9), kwargs = {})
#   %expand_4 : Tensor "f32[1, s55, 32, 128][32*s55, 32, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_602, [1, %arg31_1, 32, 128]), kwargs = {})
#   %div_6 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand_4, 128), kwargs = {})
#   %pow_10 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 1.0), kwargs = {})
#   %mul_615 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_10, 2.0), kwargs = {})
#   %mul_619 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div_6, %mul_615), kwargs = {})
#   %add_661 : Tensor "f32[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_584, %mul_619), kwargs = {})
#   %convert_element_type_46 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_661, torch.bfloat16), kwargs = {})
#   %clone_3 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%convert_element_type_46,), kwargs = {memory_format: torch.contiguous_format})
#   return %add_592,%sum_6,%clone_3
triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11 = async_compile.triton('triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 256, 'r0_': 128},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*fp32', 'in_ptr2': 'fp32', 'in_ptr3': 'fp32', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'in_ptr6': '*fp32', 'in_ptr7': 'fp32', 'out_ptr0': '*bf16', 'out_ptr2': '*bf16', 'ks0': 'i64', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (12,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 13, 'num_store': 2, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 640, 'r0_': 327936}}
)
@triton.jit
def triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, in_ptr7, out_ptr0, out_ptr2, ks0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    r0_numel = 128
    R0_BLOCK: tl.constexpr = 128
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_2 = r0_index
    x3 = xindex
    x1 = xindex // 32
    tmp27 = tl.load(in_ptr0 + (r0_2 + 128*x3), xmask, other=0.0).to(tl.float32)
    tmp28 = tl.load(in_ptr1 + (x1 + ks0*((r0_2 % 64))), xmask, eviction_policy='evict_last', other=0.0)
    tmp30 = in_ptr3
    tmp35 = tl.load(in_ptr4 + (r0_2), None, eviction_policy='evict_last').to(tl.float32)
    tmp38 = tl.load(in_ptr5 + (r0_2 + 128*x3), xmask, other=0.0).to(tl.float32)
    tmp45 = tl.load(in_ptr6 + (x3), xmask, eviction_policy='evict_last')
    tmp48 = in_ptr7
    tmp0 = r0_2
    tmp1 = tl.full([1, 1], 64, tl.int64)
    tmp2 = tmp0 >= tmp1
    tmp3 = tl.load(in_ptr0 + ((-64) + r0_2 + 128*x3), tmp2 & xmask, other=0.0).to(tl.float32)
    tmp4 = tl.load(in_ptr1 + (x1 + ks0*((r0_2 % 64))), tmp2 & xmask, eviction_policy='evict_last', other=0.0)
    tmp5 = tl_math.sin(tmp4)
    tmp6 = in_ptr2
    tmp7 = tmp5 * tmp6
    tmp8 = tmp7.to(tl.float32)
    tmp9 = tmp3 * tmp8
    tmp10 = -tmp9
    tmp11 = tl.full(tmp10.shape, 0.0, tmp10.dtype)
    tmp12 = tl.where(tmp2, tmp10, tmp11)
    tmp13 = tl.full([1, 1], 0.0, tl.float32)
    tmp14 = tl.where(tmp2, tmp12, tmp13)
    tmp15 = tmp0 < tmp1
    tmp16 = tl.load(in_ptr0 + (64 + r0_2 + 128*x3), tmp15 & xmask, other=0.0).to(tl.float32)
    tmp17 = tl.load(in_ptr1 + (x1 + ks0*((r0_2 % 64))), tmp15 & xmask, eviction_policy='evict_last', other=0.0)
    tmp18 = tl_math.sin(tmp17)
    tmp19 = in_ptr2
    tmp20 = tmp18 * tmp19
    tmp21 = tmp20.to(tl.float32)
    tmp22 = tmp16 * tmp21
    tmp23 = tl.full(tmp22.shape, 0.0, tmp22.dtype)
    tmp24 = tl.where(tmp15, tmp22, tmp23)
    tmp25 = tl.where(tmp15, tmp24, tmp13)
    tmp26 = tmp14 + tmp25
    tmp29 = tl_math.cos(tmp28)
    tmp31 = tmp29 * tmp30
    tmp32 = tmp31.to(tl.float32)
    tmp33 = tmp27 * tmp32
    tmp34 = tmp26 + tmp33
    tmp36 = tmp34 * tmp35
    tmp37 = tmp36.to(tl.float32)
    tmp39 = tmp38.to(tl.float32)
    tmp40 = tmp37 * tmp39
    tmp41 = tl.broadcast_to(tmp40, [XBLOCK, R0_BLOCK])
    tmp43 = tl.where(xmask, tmp41, 0)
    tmp44 = tl.sum(tmp43, 1)[:, None].to(tl.float32)
    tmp46 = tl.full([1, 1], 128.0, tl.float32)
    tmp47 = (tmp45 / tmp46)
    tmp49 = tmp47 + tmp48
    tmp50 = libdevice.rsqrt(tmp49)
    tmp51 = tmp37 * tmp50
    tmp52 = tl.full([1, 1], -0.5, tl.float32)
    tmp53 = tmp44 * tmp52
    tmp54 = tmp50 * tmp50
    tmp55 = tmp54 * tmp50
    tmp56 = tmp53 * tmp55
    tmp57 = tl.full([1, 1], 0.0078125, tl.float32)
    tmp58 = tmp56 * tmp57
    tmp59 = tl.full([1, 1], 2.0, tl.float32)
    tmp60 = tmp39 * tmp59
    tmp61 = tmp58 * tmp60
    tmp62 = tmp51 + tmp61
    tmp63 = tmp62.to(tl.float32)
    tl.store(out_ptr0 + (r0_2 + 128*x3), tmp34, xmask)
    tl.store(out_ptr2 + (r0_2 + 128*x3), tmp63, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/3y/c3yopy3t7jmpxhwk6hbdmii4jebpeqmpva4onnw73sfjtioohia5.py
# Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, view_16, view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, mul_8, _to_copy_8, view_14, add_7, _to_copy_11, pow_4, mean_3, add_8, rsqrt_3, view_21, view_23, add_11, view_30, mul_58, sum_7, mul_30, sum_3, mul_11, _to_copy_12, mul_14, sum_1], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.view, aten.sum]
# Source node to ATen node mapping:
#   _to_copy_11 => convert_element_type_21
#   _to_copy_12 => convert_element_type_22
#   _to_copy_3 => convert_element_type_3
#   _to_copy_4 => convert_element_type_4
#   _to_copy_7 => convert_element_type_11
#   _to_copy_8 => convert_element_type_12
#   add_1 => add_69
#   add_11 => add_458
#   add_4 => add_205
#   add_5 => add_218
#   add_7 => add_289
#   add_8 => add_302
#   mean => mean
#   mean_2 => mean_2
#   mean_3 => mean_3
#   mul_11 => mul_283
#   mul_14 => mul_309
#   mul_2 => mul_77
#   mul_30 => mul_435
#   mul_58 => mul_657
#   mul_8 => mul_209
#   pow_1 => pow_1
#   pow_3 => pow_3
#   pow_4 => pow_4
#   rsqrt => rsqrt
#   rsqrt_2 => rsqrt_2
#   rsqrt_3 => rsqrt_3
#   sum_1 => sum_1
#   sum_3 => sum_3
#   sum_7 => sum_7
#   view_14 => view_14
#   view_16 => view_16
#   view_21 => view_21
#   view_23 => view_23
#   view_30 => view_31
#   view_8 => view_8
# Graph fragment:
#   %mm_14 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_14]
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %buf0 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf0]
#   %arg6_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg6_1]
#   %mm_8 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_8]
#   %mm_10 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_10]
#   %mm_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %buf12 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf12]
#   %arg13_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg13_1]
#   %arg33_1 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=arg33_1]
#   %mm_4 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_4]
#   %buf18 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf18]
#   %arg17_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg17_1]
#   %convert_element_type_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg5_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 2), kwargs = {})
#   %mean : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   %add_69 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean, %arg6_1), kwargs = {})
#   %rsqrt : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_69,), kwargs = {})
#   %mul_77 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_3, %rsqrt), kwargs = {})
#   %convert_element_type_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_77, torch.bfloat16), kwargs = {})
#   %view_16 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%arg33_1, [1, %arg31_1, 4096]), kwargs = {})
#   %view_8 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [1, %arg31_1, 4096]), kwargs = {})
#   %add_205 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%arg5_1, %view_8), kwargs = {})
#   %convert_element_type_11 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_205, torch.float32), kwargs = {})
#   %pow_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_11, 2), kwargs = {})
#   %mean_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_3, [-1], True), kwargs = {})
#   %add_218 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_2, %arg13_1), kwargs = {})
#   %rsqrt_2 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_218,), kwargs = {})
#   %mul_209 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_11, %rsqrt_2), kwargs = {})
#   %convert_element_type_12 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_209, torch.bfloat16), kwargs = {})
#   %view_14 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_4, [1, %arg31_1, 4096]), kwargs = {})
#   %add_289 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_205, %view_14), kwargs = {})
#   %convert_element_type_21 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_289, torch.float32), kwargs = {})
#   %pow_4 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_21, 2), kwargs = {})
#   %mean_3 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_4, [-1], True), kwargs = {})
#   %add_302 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_3, %arg17_1), kwargs = {})
#   %rsqrt_3 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_302,), kwargs = {})
#   %view_21 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_8, [1, %arg31_1, 4096]), kwargs = {})
#   %view_23 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_10, [1, %arg31_1, 4096]), kwargs = {})
#   %add_458 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%view_21, %view_23), kwargs = {})
#   %view_31 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_14, [1, %arg31_1, 4096]), kwargs = {})
#   %mul_657 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_31, %convert_element_type_4), kwargs = {})
#   %sum_7 : Tensor "bf16[1, 1, 4096][4096, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_657, [0, 1], True), kwargs = {})
#   %mul_435 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%add_458, %convert_element_type_12), kwargs = {})
#   %sum_3 : Tensor "bf16[1, 1, 4096][4096, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_435, [0, 1], True), kwargs = {})
#   %mul_283 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_21, %rsqrt_3), kwargs = {})
#   %convert_element_type_22 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_283, torch.bfloat16), kwargs = {})
#   %mul_309 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_16, %convert_element_type_22), kwargs = {})
#   %sum_1 : Tensor "bf16[1, 1, 4096][4096, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_309, [0, 1], True), kwargs = {})
#   return %sum_7,%sum_3,%sum_1
triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_view_12 = async_compile.triton('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_view_12', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 4096, 'r0_': 8},
    reduction_hint=ReductionHint.DEFAULT,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': 'fp32', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'in_ptr6': '*bf16', 'in_ptr7': '*fp32', 'in_ptr8': 'fp32', 'in_ptr9': '*bf16', 'in_ptr10': '*bf16', 'in_ptr11': '*fp32', 'in_ptr12': 'fp32', 'out_ptr0': '*bf16', 'out_ptr1': '*bf16', 'out_ptr2': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (13,): [['tt.divisibility', 16]], (14,): [['tt.divisibility', 16]], (15,): [['tt.divisibility', 16]], (16,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_view_12', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 13, 'num_store': 3, 'num_reduction': 3, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 335872, 'r0_': 37}}
)
@triton.jit
def triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_view_12(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, in_ptr7, in_ptr8, in_ptr9, in_ptr10, in_ptr11, in_ptr12, out_ptr0, out_ptr1, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    tmp6 = in_ptr3
    _tmp13 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    tmp23 = in_ptr8
    _tmp30 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    tmp38 = in_ptr12
    _tmp45 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp3 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp15 = tl.load(in_ptr4 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp16 = tl.load(in_ptr5 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp18 = tl.load(in_ptr6 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp21 = tl.load(in_ptr7 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp32 = tl.load(in_ptr9 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp33 = tl.load(in_ptr10 + (x0 + 4096*r0_1), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp36 = tl.load(in_ptr11 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp2 = tmp1.to(tl.float32)
        tmp4 = tl.full([1, 1], 4096.0, tl.float32)
        tmp5 = (tmp3 / tmp4)
        tmp7 = tmp5 + tmp6
        tmp8 = libdevice.rsqrt(tmp7)
        tmp9 = tmp2 * tmp8
        tmp10 = tmp9.to(tl.float32)
        tmp11 = tmp0 * tmp10
        tmp12 = tl.broadcast_to(tmp11, [XBLOCK, R0_BLOCK])
        tmp14 = _tmp13 + tmp12
        _tmp13 = tl.where(r0_mask, tmp14, _tmp13)
        tmp17 = tmp15 + tmp16
        tmp19 = tmp1 + tmp18
        tmp20 = tmp19.to(tl.float32)
        tmp22 = (tmp21 / tmp4)
        tmp24 = tmp22 + tmp23
        tmp25 = libdevice.rsqrt(tmp24)
        tmp26 = tmp20 * tmp25
        tmp27 = tmp26.to(tl.float32)
        tmp28 = tmp17 * tmp27
        tmp29 = tl.broadcast_to(tmp28, [XBLOCK, R0_BLOCK])
        tmp31 = _tmp30 + tmp29
        _tmp30 = tl.where(r0_mask, tmp31, _tmp30)
        tmp34 = tmp19 + tmp33
        tmp35 = tmp34.to(tl.float32)
        tmp37 = (tmp36 / tmp4)
        tmp39 = tmp37 + tmp38
        tmp40 = libdevice.rsqrt(tmp39)
        tmp41 = tmp35 * tmp40
        tmp42 = tmp41.to(tl.float32)
        tmp43 = tmp32 * tmp42
        tmp44 = tl.broadcast_to(tmp43, [XBLOCK, R0_BLOCK])
        tmp46 = _tmp45 + tmp44
        _tmp45 = tl.where(r0_mask, tmp46, _tmp45)
    tmp13 = tl.sum(_tmp13, 1)[:, None]
    tmp30 = tl.sum(_tmp30, 1)[:, None]
    tmp45 = tl.sum(_tmp45, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp13, None)
    tl.store(out_ptr1 + (x0), tmp30, None)
    tl.store(out_ptr2 + (x0), tmp45, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/54/c54v4cesjpoe6auuws4ekmsel5uxuxfgkjmhjwk23vyy4fswj37z.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_44, sum_5], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum]
# Source node to ATen node mapping:
#   _to_copy_1 => convert_element_type_1
#   _to_copy_2 => convert_element_type_2
#   _to_copy_5 => convert_element_type_7
#   _to_copy_6 => convert_element_type_8
#   add_14 => add_584
#   add_15 => add_592
#   add_2 => add_113
#   bmm => unsqueeze_default
#   clone => clone
#   cos => cos
#   expand_1 => expand_1
#   mean_1 => mean_1
#   mul => mul_46
#   mul_1 => mul_53
#   mul_4 => mul_116
#   mul_41 => mul_528
#   mul_42 => mul_553
#   mul_44 => mul_570
#   neg_4 => neg_4
#   permute => permute
#   permute_4 => permute_16
#   pow_2 => pow_2
#   rsqrt_1 => rsqrt_1
#   sin => sin
#   slice_5 => slice_5
#   slice_6 => slice_6
#   slice_backward_1 => full_default_1
#   slice_backward_2 => full_default_2
#   sum_5 => sum_5
#   unsqueeze_2 => unsqueeze_2
#   unsqueeze_3 => unsqueeze_3
#   unsqueeze_4 => unsqueeze_4
#   view_2 => view_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %add_592 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0" = PlaceHolder[target=add_592]
#   %mm : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm]
#   %buf3 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 32*s55]cuda:0" = PlaceHolder[target=buf3]
#   %arg8_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg8_1]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_113 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, %arg8_1), kwargs = {})
#   %rsqrt_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_113,), kwargs = {})
#   %mul_116 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_7, %rsqrt_1), kwargs = {})
#   %convert_element_type_8 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_116, torch.bfloat16), kwargs = {})
#   %unsqueeze_default : Tensor "f32[1, 64, s55][64*s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%mm_default, 0), kwargs = {})
#   %permute : Tensor "f32[1, s55, 64][64*s55, 1, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%unsqueeze_default, [0, 2, 1]), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[1, s55, 1, 64][64*s55, 1, 64*s55, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%permute, 2), kwargs = {})
#   %expand_1 : Tensor "f32[1, s55, 2, 64][64*s55, 1, 0, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%unsqueeze_2, [1, %arg31_1, 2, 64]), kwargs = {})
#   %clone : Tensor "f32[1, s55, 2, 64][128*s55, 128, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%expand_1,), kwargs = {memory_format: torch.contiguous_format})
#   %view_2 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%clone, [1, %arg31_1, 128]), kwargs = {})
#   %cos : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cos.default](args = (%view_2,), kwargs = {})
#   %mul_46 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%cos, %arg25_1), kwargs = {})
#   %convert_element_type_1 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_46, torch.bfloat16), kwargs = {})
#   %unsqueeze_3 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_1, 1), kwargs = {})
#   %sin : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sin.default](args = (%view_2,), kwargs = {})
#   %mul_53 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%sin, %arg28_1), kwargs = {})
#   %convert_element_type_2 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_53, torch.bfloat16), kwargs = {})
#   %unsqueeze_4 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_2, 1), kwargs = {})
#   %full_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %mul_528 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_4), kwargs = {})
#   %slice_5 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 0, 64), kwargs = {})
#   %neg_4 : Tensor "bf16[1, 32, s55, 64][2048*s55, 64, 2048, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%slice_5,), kwargs = {})
#   %slice_scatter_default : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_1, %neg_4, 3, 64, 9223372036854775807), kwargs = {})
#   %full_default_2 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %slice_6 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 64, 128), kwargs = {})
#   %slice_scatter_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_2, %slice_6, 3, 0, 64), kwargs = {})
#   %add_584 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%slice_scatter_default, %slice_scatter_default_1), kwargs = {})
#   %mul_553 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_3), kwargs = {})
#   %add_592 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_584, %mul_553), kwargs = {})
#   %permute_16 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.permute.default](args = (%add_592, [0, 2, 1, 3]), kwargs = {})
#   %mul_570 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%permute_16, %convert_element_type_8), kwargs = {})
#   %sum_5 : Tensor "bf16[1, 1, 1, 128][128, 128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_570, [0, 1, 2], True), kwargs = {})
#   return %buf39
triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13 = async_compile.triton('triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 256, 'r0_': 128},
    reduction_hint=ReductionHint.OUTER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': 'fp32', 'out_ptr0': '*fp32', 'ks0': 'i64', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 4, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 83968, 'r0_': 640}}
)
@triton.jit
def triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13(in_ptr0, in_ptr1, in_ptr2, in_ptr3, out_ptr0, ks0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 256
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = (xindex % 128)
    x1 = xindex // 128
    tmp6 = in_ptr3
    _tmp13 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    x3 = xindex
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_2 = r0_index
        tmp0 = tl.load(in_ptr0 + (x0 + 128*(((r0_2 + 16*ks0*x1) % (32*ks0)))), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (x0 + 128*(((r0_2 + 16*ks0*x1) % (32*ks0)))), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp3 = tl.load(in_ptr2 + (((r0_2 + 16*ks0*x1) % (32*ks0))), r0_mask & xmask, eviction_policy='evict_last', other=0.0)
        tmp2 = tmp1.to(tl.float32)
        tmp4 = tl.full([1, 1], 128.0, tl.float32)
        tmp5 = (tmp3 / tmp4)
        tmp7 = tmp5 + tmp6
        tmp8 = libdevice.rsqrt(tmp7)
        tmp9 = tmp2 * tmp8
        tmp10 = tmp9.to(tl.float32)
        tmp11 = tmp0 * tmp10
        tmp12 = tl.broadcast_to(tmp11, [XBLOCK, R0_BLOCK])
        tmp14 = _tmp13 + tmp12
        _tmp13 = tl.where(r0_mask & xmask, tmp14, _tmp13)
    tmp13 = tl.sum(_tmp13, 1)[:, None]
    tl.store(out_ptr0 + (x3), tmp13, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/wt/cwtsqgdfhfb6ony5khf2puycyw6hbubfjibhdoacv6ygbbw4c6rw.py
# Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_44, sum_5], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum]
# Source node to ATen node mapping:
#   _to_copy_1 => convert_element_type_1
#   _to_copy_2 => convert_element_type_2
#   _to_copy_5 => convert_element_type_7
#   _to_copy_6 => convert_element_type_8
#   add_14 => add_584
#   add_15 => add_592
#   add_2 => add_113
#   bmm => unsqueeze_default
#   clone => clone
#   cos => cos
#   expand_1 => expand_1
#   mean_1 => mean_1
#   mul => mul_46
#   mul_1 => mul_53
#   mul_4 => mul_116
#   mul_41 => mul_528
#   mul_42 => mul_553
#   mul_44 => mul_570
#   neg_4 => neg_4
#   permute => permute
#   permute_4 => permute_16
#   pow_2 => pow_2
#   rsqrt_1 => rsqrt_1
#   sin => sin
#   slice_5 => slice_5
#   slice_6 => slice_6
#   slice_backward_1 => full_default_1
#   slice_backward_2 => full_default_2
#   sum_5 => sum_5
#   unsqueeze_2 => unsqueeze_2
#   unsqueeze_3 => unsqueeze_3
#   unsqueeze_4 => unsqueeze_4
#   view_2 => view_2
#   view_4 => view_4
#   view_5 => view_5
# Graph fragment:
#   %buf39 : Tensor "f32[1, 1, 1, 128, 2][256, 256, 256, 1, 128]cuda:0" = PlaceHolder[target=buf39]
#   %view_4 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [1, %arg31_1, 4096]), kwargs = {})
#   %view_5 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [1, %arg31_1, -1, 128]), kwargs = {})
#   %convert_element_type_7 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_5, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_7, 2), kwargs = {})
#   %mean_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_113 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, %arg8_1), kwargs = {})
#   %rsqrt_1 : Tensor "f32[1, s55, 32, 1][32*s55, 32, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_113,), kwargs = {})
#   %mul_116 : Tensor "f32[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_7, %rsqrt_1), kwargs = {})
#   %convert_element_type_8 : Tensor "bf16[1, s55, 32, 128][4096*s55, 4096, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_116, torch.bfloat16), kwargs = {})
#   %unsqueeze_default : Tensor "f32[1, 64, s55][64*s55, s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%mm_default, 0), kwargs = {})
#   %permute : Tensor "f32[1, s55, 64][64*s55, 1, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%unsqueeze_default, [0, 2, 1]), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[1, s55, 1, 64][64*s55, 1, 64*s55, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%permute, 2), kwargs = {})
#   %expand_1 : Tensor "f32[1, s55, 2, 64][64*s55, 1, 0, s55]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%unsqueeze_2, [1, %arg31_1, 2, 64]), kwargs = {})
#   %clone : Tensor "f32[1, s55, 2, 64][128*s55, 128, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%expand_1,), kwargs = {memory_format: torch.contiguous_format})
#   %view_2 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%clone, [1, %arg31_1, 128]), kwargs = {})
#   %cos : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cos.default](args = (%view_2,), kwargs = {})
#   %mul_46 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%cos, %arg25_1), kwargs = {})
#   %convert_element_type_1 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_46, torch.bfloat16), kwargs = {})
#   %unsqueeze_3 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_1, 1), kwargs = {})
#   %sin : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sin.default](args = (%view_2,), kwargs = {})
#   %mul_53 : Tensor "f32[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%sin, %arg28_1), kwargs = {})
#   %convert_element_type_2 : Tensor "bf16[1, s55, 128][128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_53, torch.bfloat16), kwargs = {})
#   %unsqueeze_4 : Tensor "bf16[1, 1, s55, 128][128*s55, 128*s55, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%convert_element_type_2, 1), kwargs = {})
#   %full_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %mul_528 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_4), kwargs = {})
#   %slice_5 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 0, 64), kwargs = {})
#   %neg_4 : Tensor "bf16[1, 32, s55, 64][2048*s55, 64, 2048, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%slice_5,), kwargs = {})
#   %slice_scatter_default : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_1, %neg_4, 3, 64, 9223372036854775807), kwargs = {})
#   %full_default_2 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([1, 32, %arg31_1, 128], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %slice_6 : Tensor "bf16[1, 32, s55, 64][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_528, 3, 64, 128), kwargs = {})
#   %slice_scatter_default_1 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default_2, %slice_6, 3, 0, 64), kwargs = {})
#   %add_584 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%slice_scatter_default, %slice_scatter_default_1), kwargs = {})
#   %mul_553 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%getitem_2, %unsqueeze_3), kwargs = {})
#   %add_592 : Tensor "bf16[1, 32, s55, 128][4096*s55, 128*s55, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_584, %mul_553), kwargs = {})
#   %permute_16 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.permute.default](args = (%add_592, [0, 2, 1, 3]), kwargs = {})
#   %mul_570 : Tensor "bf16[1, s55, 32, 128][4096*s55, 128, 128*s55, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%permute_16, %convert_element_type_8), kwargs = {})
#   %sum_5 : Tensor "bf16[1, 1, 1, 128][128, 128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_570, [0, 1, 2], True), kwargs = {})
#   return %sum_5
triton_per_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_14 = async_compile.triton('triton_per_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_14', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 128, 'r0_': 2},
    reduction_hint=ReductionHint.OUTER_TINY,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_14', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 1536, 'r0_': 0}}
)
@triton.jit
def triton_per_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_14(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 128
    r0_numel = 2
    R0_BLOCK: tl.constexpr = 2
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0 + 128*r0_1), xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(xmask, tmp1, 0)
    tmp4 = tl.sum(tmp3, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp4, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/l2/cl2pdjbxwwnuap3ysw3oinzoppaw5ex6egk7cfm2okiuds6gbarv.py
# Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, view_30, mul_57, _to_copy_21, mul_60, mul_59, sum_8, mul_61, pow_11, mul_62, expand_5, div_7, pow_12, mul_63, mul_64, add_17, _to_copy_22, add_18], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.view, aten.mul, aten.sum, aten.expand, aten.div]
# Source node to ATen node mapping:
#   _to_copy_21 => convert_element_type_51
#   _to_copy_22 => convert_element_type_52
#   _to_copy_3 => convert_element_type_3
#   add_1 => add_69
#   add_17 => add_733
#   add_18 => add_740
#   div_7 => div_7
#   expand_5 => expand_5
#   mean => mean
#   mul_57 => mul_653
#   mul_59 => mul_664
#   mul_60 => mul_668
#   mul_61 => mul_678
#   mul_62 => mul_681
#   mul_63 => mul_692
#   mul_64 => mul_696
#   pow_1 => pow_1
#   pow_11 => pow_11
#   pow_12 => pow_12
#   rsqrt => rsqrt
#   sum_8 => sum_8
#   view_30 => view_31
# Graph fragment:
#   %mm_14 : Tensor "bf16[s55, 4096][4096, 1]cuda:0" = PlaceHolder[target=mm_14]
#   %arg0_1 : Tensor "bf16[4096][1]cuda:0" = PlaceHolder[target=arg0_1]
#   %arg5_1 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=arg5_1]
#   %add_514 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0" = PlaceHolder[target=add_514]
#   %buf0 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=buf0]
#   %arg6_1 : Tensor "f32[][]cpu" = PlaceHolder[target=arg6_1]
#   %sum_8 : Tensor "f32[1, s55, 1][s55, 1, s55]cuda:0" = PlaceHolder[target=sum_8]
#   %convert_element_type_3 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg5_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 2), kwargs = {})
#   %mean : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   %add_69 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean, %arg6_1), kwargs = {})
#   %rsqrt : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_69,), kwargs = {})
#   %view_31 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_14, [1, %arg31_1, 4096]), kwargs = {})
#   %mul_653 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_31, %arg0_1), kwargs = {})
#   %convert_element_type_51 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_653, torch.float32), kwargs = {})
#   %mul_668 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_51, %rsqrt), kwargs = {})
#   %mul_664 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_51, %convert_element_type_3), kwargs = {})
#   %sum_8 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_664, [2], True), kwargs = {})
#   %mul_678 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_8, -0.5), kwargs = {})
#   %pow_11 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt, 3), kwargs = {})
#   %mul_681 : Tensor "f32[1, s55, 1][s55, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_678, %pow_11), kwargs = {})
#   %expand_5 : Tensor "f32[1, s55, 4096][s55, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_681, [1, %arg31_1, 4096]), kwargs = {})
#   %div_7 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand_5, 4096), kwargs = {})
#   %pow_12 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 1.0), kwargs = {})
#   %mul_692 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_12, 2.0), kwargs = {})
#   %mul_696 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div_7, %mul_692), kwargs = {})
#   %add_733 : Tensor "f32[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_668, %mul_696), kwargs = {})
#   %convert_element_type_52 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_733, torch.bfloat16), kwargs = {})
#   %add_740 : Tensor "bf16[1, s55, 4096][4096*s55, 4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_514, %convert_element_type_52), kwargs = {})
#   return %sum_8,%add_740
triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_15 = async_compile.triton('triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_15', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*bf16', 'in_ptr3': '*fp32', 'in_ptr4': 'fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_15', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 9, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 12, 'r0_': 212992}}
)
@triton.jit
def triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_15(in_out_ptr0, in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp8 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_out_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr0 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp4 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 * tmp1
        tmp3 = tmp2.to(tl.float32)
        tmp5 = tmp4.to(tl.float32)
        tmp6 = tmp3 * tmp5
        tmp7 = tl.broadcast_to(tmp6, [XBLOCK, R0_BLOCK])
        tmp9 = _tmp8 + tmp7
        _tmp8 = tl.where(r0_mask & xmask, tmp9, _tmp8)
    tmp8 = tl.sum(_tmp8, 1)[:, None]
    tmp15 = tl.load(in_ptr3 + (x0), xmask, eviction_policy='evict_last')
    tmp18 = in_ptr4
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp10 = tl.load(in_ptr2 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp11 = tl.load(in_out_ptr0 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp12 = tl.load(in_ptr0 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp29 = tl.load(in_ptr1 + (r0_1 + 4096*x0), r0_mask & xmask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp13 = tmp11 * tmp12
        tmp14 = tmp13.to(tl.float32)
        tmp16 = tl.full([1, 1], 4096.0, tl.float32)
        tmp17 = (tmp15 / tmp16)
        tmp19 = tmp17 + tmp18
        tmp20 = libdevice.rsqrt(tmp19)
        tmp21 = tmp14 * tmp20
        tmp22 = tl.full([1, 1], -0.5, tl.float32)
        tmp23 = tmp8 * tmp22
        tmp24 = tmp20 * tmp20
        tmp25 = tmp24 * tmp20
        tmp26 = tmp23 * tmp25
        tmp27 = tl.full([1, 1], 0.000244140625, tl.float32)
        tmp28 = tmp26 * tmp27
        tmp30 = tmp29.to(tl.float32)
        tmp31 = tl.full([1, 1], 2.0, tl.float32)
        tmp32 = tmp30 * tmp31
        tmp33 = tmp28 * tmp32
        tmp34 = tmp21 + tmp33
        tmp35 = tmp34.to(tl.float32)
        tmp36 = tmp10 + tmp35
        tl.store(in_out_ptr0 + (r0_1 + 4096*x0), tmp36, r0_mask & xmask)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1, arg10_1, arg11_1, arg12_1, arg13_1, arg14_1, arg15_1, arg16_1, arg17_1, arg18_1, arg19_1, arg20_1, arg21_1, arg22_1, arg23_1, arg24_1, arg25_1, arg26_1, arg27_1, arg28_1, arg29_1, arg30_1, arg31_1, arg32_1, arg33_1 = args
        args.clear()
        s55 = arg31_1
        s73 = arg32_1
        assert_size_stride(arg0_1, (4096, ), (1, ))
        assert_size_stride(arg1_1, (128, ), (1, ))
        assert_size_stride(arg2_1, (128, ), (1, ))
        assert_size_stride(arg3_1, (4096, ), (1, ))
        assert_size_stride(arg4_1, (4096, ), (1, ))
        assert_size_stride(arg5_1, (1, s55, 4096), (4096*s55, 4096, 1))
        assert_size_stride(arg6_1, (), ())
        assert_size_stride(arg7_1, (4096, 4096), (1, 4096))
        assert_size_stride(arg8_1, (), ())
        assert_size_stride(arg9_1, (4096, 1024), (1, 4096))
        assert_size_stride(arg10_1, (), ())
        assert_size_stride(arg11_1, (4096, 1024), (1, 4096))
        assert_size_stride(arg12_1, (4096, 4096), (1, 4096))
        assert_size_stride(arg13_1, (), ())
        assert_size_stride(arg14_1, (4096, 12288), (1, 4096))
        assert_size_stride(arg15_1, (4096, 12288), (1, 4096))
        assert_size_stride(arg16_1, (12288, 4096), (1, 12288))
        assert_size_stride(arg17_1, (), ())
        assert_size_stride(arg18_1, (), ())
        assert_size_stride(arg19_1, (), ())
        assert_size_stride(arg20_1, (1, 1, s55, 1), (s55, s55, 1, 1))
        assert_size_stride(arg21_1, (1, 1, 1, s73), (s73, s73, s73, 1))
        assert_size_stride(arg22_1, (), ())
        assert_size_stride(arg23_1, (1, 1, 1, s73), (s73, s73, s73, 1))
        assert_size_stride(arg24_1, (1, 1, s55, 1), (s55, s55, 1, 1))
        assert_size_stride(arg25_1, (), ())
        assert_size_stride(arg26_1, (s55, ), (1, ))
        assert_size_stride(arg27_1, (1, 64, 1), (64, 1, 1))
        assert_size_stride(arg28_1, (), ())
        assert_size_stride(arg29_1, (1, 8, 1, s73, 128), (1024, 128, 128, 1024, 1))
        assert_size_stride(arg30_1, (1, 8, 1, s73, 128), (1024, 128, 128, 1024, 1))
        assert_size_stride(arg33_1, (s55, 4096), (4096, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((1, s55, 1), (s55, 1, s55), torch.float32)
            buf1 = empty_strided_cuda((1, s55, 4096), (4096*s55, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, mul_3], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0.run(arg5_1, arg0_1, arg6_1.item(), buf0, buf1, s55, 4096, stream=stream0)
            buf2 = empty_strided_cuda((s55, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, mul_3, view_3, mm], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf1, (s55, 4096), (4096, 1), 0), arg7_1, out=buf2)
            buf3 = empty_strided_cuda((1, s55, 32, 1), (32*s55, 32, 1, 32*s55), torch.float32)
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean]
            triton_per_fused__to_copy_mean_pow_view_1_xnumel = 32*s55
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy_mean_pow_view_1.run(buf2, buf3, triton_per_fused__to_copy_mean_pow_view_1_xnumel, 128, stream=stream0)
            buf4 = empty_strided_cuda((1, 1, s55), (s55, s55, 1), torch.float32)
            # Topologically Sorted Source Nodes: [add, unsqueeze, unsqueeze_1, _to_copy], Original ATen: [aten.add, aten.unsqueeze, aten._to_copy]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_unsqueeze_2.run(arg26_1, buf4, s55, stream=stream0)
            del arg26_1
            buf5 = empty_strided_cuda((64, s55), (s55, 1), torch.float32)
            # Topologically Sorted Source Nodes: [bmm, add, unsqueeze, unsqueeze_1, _to_copy], Original ATen: [aten.bmm, aten.add, aten.unsqueeze, aten._to_copy]
            extern_kernels.mm(reinterpret_tensor(arg27_1, (64, 1), (1, 1), 0), reinterpret_tensor(buf4, (1, s55), (0, 1), 0), out=buf5)
            del arg27_1
            buf6 = empty_strided_cuda((1, 32, s55, 128), (4096*s55, 1, 32, 32*s55), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, mul_5, permute_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, slice_3, neg, slice_2, cat, sin, mul_1, _to_copy_2, unsqueeze_4, mul_7], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.permute, aten.bmm, aten.unsqueeze, aten.expand, aten.clone, aten.slice, aten.neg, aten.cat, aten.sin]
            triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3_xnumel = 32*s55
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3.run(arg1_1, buf2, buf3, arg8_1.item(), buf5, arg28_1.item(), buf6, s55, 128, triton_poi_fused__to_copy_add_bmm_cat_clone_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_unsqueeze_view_3_xnumel, stream=stream0)
            buf7 = empty_strided_cuda((1, 32, s55, 128), (4096*s55, 128, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, mul_5, permute_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, mul_6, add_3], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.permute, aten.bmm, aten.unsqueeze, aten.expand, aten.clone, aten.cos]
            triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4_ynumel = 32*s55
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4.run(arg1_1, buf2, buf3, arg8_1.item(), buf5, arg25_1.item(), buf6, buf7, s55, triton_poi_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_permute_pow_rsqrt_unsqueeze_view_4_ynumel, 128, stream=stream0)
            # Topologically Sorted Source Nodes: [squeeze, squeeze_1, causal_blocks], Original ATen: [aten.squeeze, streamfx.causal_blocks]
            buf8 = torch.ops.streamfx.causal_blocks.default('cudnn', buf7, reinterpret_tensor(arg29_1, (1, 8, s73, 128), (1024, 128, 1024, 1), 0), reinterpret_tensor(arg30_1, (1, 8, s73, 128), (1024, 128, 1024, 1), 0), 0.08838834764831845)
            buf9 = buf8[0]
            assert_size_stride(buf9, (1, 32, s55, 128), (4096*s55, 128, 4096, 1), 'torch.ops.streamfx.causal_blocks.default')
            assert_alignment(buf9, 16, 'torch.ops.streamfx.causal_blocks.default')
            buf10 = buf8[1]
            assert_size_stride(buf10, (1, 32, s55), (32*s55, s55, 1), 'torch.ops.streamfx.causal_blocks.default')
            assert_alignment(buf10, 16, 'torch.ops.streamfx.causal_blocks.default')
            del buf8
            buf11 = reinterpret_tensor(buf6, (s55, 4096), (4096, 1), 0); del buf6  # reuse
            # Topologically Sorted Source Nodes: [permute_2, view_6, view_7, mm_1], Original ATen: [aten.permute, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf9, (s55, 4096), (4096, 1), 0), arg12_1, out=buf11)
            buf12 = reinterpret_tensor(buf4, (1, s55, 1), (s55, 1, s55), 0); del buf4  # reuse
            buf13 = empty_strided_cuda((1, s55, 4096), (4096*s55, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, mul_8, _to_copy_8, mul_9], Original ATen: [aten.view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_5.run(arg5_1, buf11, arg3_1, arg13_1.item(), buf12, buf13, s55, 4096, stream=stream0)
            buf14 = empty_strided_cuda((s55, 12288), (12288, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_9, mm_2], Original ATen: [aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf13, (s55, 4096), (4096, 1), 0), arg14_1, out=buf14)
            buf15 = empty_strided_cuda((s55, 12288), (12288, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_11, mm_3], Original ATen: [aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf13, (s55, 4096), (4096, 1), 0), arg15_1, out=buf15)
            buf16 = empty_strided_cuda((1, s55, 12288), (12288*s55, 12288, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, mul_10], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul]
            triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6_xnumel = 12288*s55
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6.run(buf14, buf15, buf16, triton_poi_fused__to_copy_add_div_exp_mul_neg_view_6_xnumel, stream=stream0)
            buf17 = empty_strided_cuda((s55, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, mul_10, view_13, mm_4], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf16, (s55, 12288), (12288, 1), 0), arg16_1, out=buf17)
            buf18 = empty_strided_cuda((1, s55, 1), (s55, 1, s55), torch.float32)
            buf20 = empty_strided_cuda((1, s55, 4096), (4096*s55, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_16, mul_13, _to_copy_13, view_8, add_4, view_14, add_7, _to_copy_11, pow_4, mean_3, add_8, rsqrt_3, mul_16, mul_15, sum_2, mul_17, pow_5, mul_18, expand_2, div_1, pow_6, mul_19, mul_20, add_9, _to_copy_14], Original ATen: [aten.view, aten.mul, aten._to_copy, aten.add, aten.pow, aten.mean, aten.rsqrt, aten.sum, aten.expand, aten.div]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_7.run(arg5_1, buf11, buf17, arg33_1, arg4_1, arg17_1.item(), buf18, buf20, s55, 4096, stream=stream0)
            del arg4_1
            buf21 = empty_strided_cuda((s55, 12288), (12288, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_18, t_2, mm_6], Original ATen: [aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf20, (s55, 4096), (4096, 1), 0), reinterpret_tensor(arg16_1, (4096, 12288), (12288, 1), 0), out=buf21)
            del arg16_1
            buf22 = empty_strided_cuda((1, s55, 12288), (12288*s55, 12288, 1), torch.bfloat16)
            buf24 = reinterpret_tensor(buf15, (1, s55, 12288), (12288*s55, 12288, 1), 0); del buf15  # reuse
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, view_19, mul_23, mul_24, _to_copy_15, div_4, neg_2, div_2, div_3, mul_25, mul_26, neg_3, add_10, _to_copy_16], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul]
            triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8_xnumel = 12288*s55
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8.run(buf24, buf21, buf14, buf22, triton_poi_fused__to_copy_add_div_exp_mul_neg_view_8_xnumel, stream=stream0)
            del buf14
            del buf21
            buf23 = empty_strided_cuda((s55, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_19, mul_23, view_20, t_5, mm_8], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf22, (s55, 12288), (12288, 1), 0), reinterpret_tensor(arg15_1, (12288, 4096), (4096, 1), 0), out=buf23)
            del arg15_1
            buf25 = empty_strided_cuda((s55, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, view_12, view_19, mul_24, _to_copy_15, div_4, neg_2, div_2, div_3, mul_25, mul_26, neg_3, add_10, _to_copy_16, view_22, t_8, mm_10], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.mul, aten.div, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf24, (s55, 12288), (12288, 1), 0), reinterpret_tensor(arg14_1, (12288, 4096), (4096, 1), 0), out=buf25)
            del arg14_1
            buf27 = empty_strided_cuda((1, s55, 4096), (4096*s55, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, view_21, view_23, add_11, mul_29, _to_copy_17, mul_32, mul_31, sum_4, mul_33, pow_7, mul_34, expand_3, div_5, pow_8, mul_35, mul_36, add_12, _to_copy_18, add_13], Original ATen: [aten.view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul, aten.sum, aten.expand, aten.div]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_9.run(buf23, buf25, arg3_1, arg5_1, buf11, buf20, buf12, arg13_1.item(), buf27, s55, 4096, stream=stream0)
            del arg3_1
            buf28 = empty_strided_cuda((s55, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_25, t_11, mm_12], Original ATen: [aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf27, (s55, 4096), (4096, 1), 0), reinterpret_tensor(arg12_1, (4096, 4096), (4096, 1), 0), out=buf28)
            del arg12_1
            ps0 = 128*s55
            buf29 = empty_strided_cuda((1, 32, s55, 128), (4096*s55, 128*s55, 128, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [squeeze, squeeze_1, view_26, view_27, permute_3, clone_2, causal_blocks_backward], Original ATen: [aten.squeeze, aten.view, aten.permute, aten.clone, streamfx.causal_blocks_backward]
            triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10_xnumel = 4096*s55
            stream0 = get_raw_stream(0)
            triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10.run(buf28, buf29, s55, ps0, triton_poi_fused_causal_blocks_backward_clone_permute_squeeze_view_10_xnumel, stream=stream0)
            del buf28
            # Topologically Sorted Source Nodes: [squeeze, squeeze_1, view_26, view_27, permute_3, clone_2, causal_blocks_backward], Original ATen: [aten.squeeze, aten.view, aten.permute, aten.clone, streamfx.causal_blocks_backward]
            buf30 = torch.ops.streamfx.causal_blocks_backward.default('cudnn', buf29, buf7, reinterpret_tensor(arg29_1, (1, 8, s73, 128), (1024, 128, 1024, 1), 0), reinterpret_tensor(arg30_1, (1, 8, s73, 128), (1024, 128, 1024, 1), 0), buf9, buf10, 0.08838834764831845)
            del arg29_1
            del arg30_1
            del buf10
            buf31 = buf30[0]
            assert_size_stride(buf31, (1, 32, s55, 128), (4096*s55, 128, 4096, 1), 'torch.ops.streamfx.causal_blocks_backward.default')
            assert_alignment(buf31, 16, 'torch.ops.streamfx.causal_blocks_backward.default')
            buf32 = buf30[1]
            assert_size_stride(buf32, (1, 8, s73, 128), (1024, 128, 1024, 1), 'torch.ops.streamfx.causal_blocks_backward.default')
            assert_alignment(buf32, 16, 'torch.ops.streamfx.causal_blocks_backward.default')
            buf33 = buf30[2]
            assert_size_stride(buf33, (1, 8, s73, 128), (1024, 128, 1024, 1), 'torch.ops.streamfx.causal_blocks_backward.default')
            assert_alignment(buf33, 16, 'torch.ops.streamfx.causal_blocks_backward.default')
            del buf30
            buf34 = buf7; del buf7  # reuse
            buf36 = reinterpret_tensor(buf29, (1, s55, 32, 128), (4096*s55, 4096, 128, 1), 0); del buf29  # reuse
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_43, _to_copy_19, mul_46, mul_45, sum_6, mul_47, pow_9, mul_48, expand_4, div_6, pow_10, mul_49, mul_50, add_16, _to_copy_20, clone_3], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.mul, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum, aten.div]
            triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11_xnumel = 32*s55
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11.run(buf31, buf5, arg28_1.item(), arg25_1.item(), arg1_1, buf2, buf3, arg8_1.item(), buf34, buf36, s55, triton_per_fused__to_copy_add_bmm_clone_cos_div_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_11_xnumel, 128, stream=stream0)
            del arg1_1
            del arg25_1
            del arg28_1
            del buf5
            buf37 = reinterpret_tensor(buf31, (s55, 4096), (4096, 1), 0); del buf31  # reuse
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_43, _to_copy_19, mul_46, mul_47, pow_9, mul_48, expand_4, div_6, pow_10, mul_49, mul_50, add_16, _to_copy_20, clone_3, _unsafe_view, view_29, t_14, mm_14], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.mul, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.div, aten._unsafe_view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf36, (s55, 4096), (4096, 1), 0), reinterpret_tensor(arg7_1, (4096, 4096), (4096, 1), 0), out=buf37)
            del arg7_1
            buf38 = empty_strided_cuda((1, 1, 4096), (4096, 4096, 1), torch.bfloat16)
            buf41 = empty_strided_cuda((1, 1, 4096), (4096, 4096, 1), torch.bfloat16)
            buf42 = empty_strided_cuda((1, 1, 4096), (4096, 4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, view_16, view_8, add_4, _to_copy_7, pow_3, mean_2, add_5, rsqrt_2, mul_8, _to_copy_8, view_14, add_7, _to_copy_11, pow_4, mean_3, add_8, rsqrt_3, view_21, view_23, add_11, view_30, mul_58, sum_7, mul_30, sum_3, mul_11, _to_copy_12, mul_14, sum_1], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.view, aten.sum]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_view_12.run(buf37, arg5_1, buf0, arg6_1.item(), buf23, buf25, buf11, buf12, arg13_1.item(), arg33_1, buf17, buf18, arg17_1.item(), buf38, buf41, buf42, 4096, s55, stream=stream0)
            del arg13_1
            del arg17_1
            del arg33_1
            del buf11
            del buf12
            del buf17
            del buf18
            del buf23
            del buf25
            buf39 = empty_strided_cuda((1, 1, 1, 128, 2), (256, 256, 256, 1, 128), torch.float32)
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_44, sum_5], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum]
            triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13_r0_numel = 16*s55
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13.run(buf34, buf2, buf3, arg8_1.item(), buf39, s55, 256, triton_red_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_13_r0_numel, stream=stream0)
            del arg8_1
            del buf2
            del buf3
            del buf34
            buf40 = empty_strided_cuda((1, 1, 1, 128), (128, 128, 128, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, mul_4, _to_copy_6, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_44, sum_5], Original ATen: [aten.view, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.sum]
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy_add_bmm_clone_cos_expand_mean_mul_neg_permute_pow_rsqrt_sin_slice_slice_backward_sum_unsqueeze_view_14.run(buf39, buf40, 128, 2, stream=stream0)
            del buf39
            buf44 = reinterpret_tensor(buf37, (1, s55, 4096), (4096*s55, 4096, 1), 0); del buf37  # reuse
            # Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, view_30, mul_57, _to_copy_21, mul_60, mul_59, sum_8, mul_61, pow_11, mul_62, expand_5, div_7, pow_12, mul_63, mul_64, add_17, _to_copy_22, add_18], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.view, aten.mul, aten.sum, aten.expand, aten.div]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_div_expand_mean_mul_pow_rsqrt_sum_view_15.run(buf44, arg0_1, arg5_1, buf27, buf0, arg6_1.item(), s55, 4096, stream=stream0)
            del arg0_1
            del arg5_1
            del arg6_1
            del buf0
            buf45 = empty_strided_cuda((4096, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [_to_copy_3, pow_1, mean, add_1, rsqrt, mul_2, _to_copy_4, mul_3, view_3, view_4, view_5, _to_copy_5, pow_2, mean_1, add_2, rsqrt_1, bmm, permute, unsqueeze_2, expand_1, clone, view_2, cos, mul, _to_copy_1, unsqueeze_3, sin, mul_1, _to_copy_2, unsqueeze_4, slice_backward_1, mul_41, slice_5, neg_4, slice_backward_2, slice_6, add_14, mul_42, add_15, permute_4, mul_43, _to_copy_19, mul_46, mul_47, pow_9, mul_48, expand_4, div_6, pow_10, mul_49, mul_50, add_16, _to_copy_20, clone_3, _unsafe_view, view_29, t_12, mm_13], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.view, aten.bmm, aten.permute, aten.unsqueeze, aten.expand, aten.clone, aten.cos, aten.sin, aten.slice_backward, aten.slice, aten.neg, aten.div, aten._unsafe_view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf36, (4096, s55), (1, 4096), 0), reinterpret_tensor(buf1, (s55, 4096), (4096, 1), 0), out=buf45)
            del buf1
            del buf36
            buf46 = empty_strided_cuda((4096, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [permute_2, view_6, view_7, view_25, t_9, mm_11], Original ATen: [aten.permute, aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf27, (4096, s55), (1, 4096), 0), reinterpret_tensor(buf9, (s55, 4096), (4096, 1), 0), out=buf46)
            del buf27
            del buf9
            buf47 = empty_strided_cuda((12288, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_9, view_10, _to_copy_9, neg_1, exp, add_6, view_12, view_19, mul_24, _to_copy_15, div_4, neg_2, div_2, div_3, mul_25, mul_26, neg_3, add_10, _to_copy_16, view_22, t_6, mm_9], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.mul, aten.div, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf24, (12288, s55), (1, 12288), 0), reinterpret_tensor(buf13, (s55, 4096), (4096, 1), 0), out=buf47)
            del buf24
            buf48 = empty_strided_cuda((12288, 4096), (4096, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_11, view_19, mul_23, view_20, t_3, mm_7], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf22, (12288, s55), (1, 12288), 0), reinterpret_tensor(buf13, (s55, 4096), (4096, 1), 0), out=buf48)
            del buf13
            del buf22
            buf49 = empty_strided_cuda((4096, 12288), (12288, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_10, _to_copy_9, neg_1, exp, add_6, div, _to_copy_10, view_12, mul_10, view_13, view_18, t, mm_5], Original ATen: [aten.view, aten._to_copy, aten.neg, aten.exp, aten.add, aten.div, aten.mul, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf20, (4096, s55), (1, 4096), 0), reinterpret_tensor(buf16, (s55, 12288), (12288, 1), 0), out=buf49)
            del buf16
            del buf20
        return (reinterpret_tensor(buf38, (4096, ), (1, ), 0), reinterpret_tensor(buf40, (128, ), (1, ), 0), reinterpret_tensor(buf41, (4096, ), (1, ), 0), reinterpret_tensor(buf42, (4096, ), (1, ), 0), buf44, reinterpret_tensor(buf45, (4096, 4096), (1, 4096), 0), reinterpret_tensor(buf46, (4096, 4096), (1, 4096), 0), reinterpret_tensor(buf47, (4096, 12288), (1, 4096), 0), reinterpret_tensor(buf48, (4096, 12288), (1, 4096), 0), reinterpret_tensor(buf49, (12288, 4096), (1, 12288), 0), reinterpret_tensor(buf32, (1, 8, 1, s73, 128), (1024, 128, 1024*s73, 1024, 1), 0), reinterpret_tensor(buf33, (1, 8, 1, s73, 128), (1024, 128, 1024*s73, 1024, 1), 0), )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((4096, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg1_1 = rand_strided((128, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg2_1 = rand_strided((128, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg3_1 = rand_strided((4096, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg4_1 = rand_strided((4096, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg5_1 = rand_strided((1, 5, 4096), (20480, 4096, 1), device='cuda:0', dtype=torch.bfloat16)
    arg6_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg7_1 = rand_strided((4096, 4096), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg8_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg9_1 = rand_strided((4096, 1024), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg10_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg11_1 = rand_strided((4096, 1024), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg12_1 = rand_strided((4096, 4096), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg13_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg14_1 = rand_strided((4096, 12288), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg15_1 = rand_strided((4096, 12288), (1, 4096), device='cuda:0', dtype=torch.bfloat16)
    arg16_1 = rand_strided((12288, 4096), (1, 12288), device='cuda:0', dtype=torch.bfloat16)
    arg17_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg18_1 = rand_strided((), (), device='cuda:0', dtype=torch.bfloat16)
    arg19_1 = rand_strided((), (), device='cuda:0', dtype=torch.bfloat16)
    arg20_1 = rand_strided((1, 1, 5, 1), (5, 5, 1, 1), device='cuda:0', dtype=torch.int64)
    arg21_1 = rand_strided((1, 1, 1, 13), (13, 13, 13, 1), device='cuda:0', dtype=torch.int64)
    arg22_1 = rand_strided((), (), device='cuda:0', dtype=torch.bool)
    arg23_1 = rand_strided((1, 1, 1, 13), (13, 13, 13, 1), device='cuda:0', dtype=torch.int64)
    arg24_1 = rand_strided((1, 1, 5, 1), (5, 5, 1, 1), device='cuda:0', dtype=torch.int64)
    arg25_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg26_1 = rand_strided((5, ), (1, ), device='cuda:0', dtype=torch.int64)
    arg27_1 = rand_strided((1, 64, 1), (64, 1, 1), device='cuda:0', dtype=torch.float32)
    arg28_1 = rand_strided((), (), device='cpu', dtype=torch.float32)
    arg29_1 = rand_strided((1, 8, 1, 13, 128), (1024, 128, 128, 1024, 1), device='cuda:0', dtype=torch.bfloat16)
    arg30_1 = rand_strided((1, 8, 1, 13, 128), (1024, 128, 128, 1024, 1), device='cuda:0', dtype=torch.bfloat16)
    arg31_1 = 5
    arg32_1 = 13
    arg33_1 = rand_strided((5, 4096), (4096, 1), device='cuda:0', dtype=torch.bfloat16)
    return [arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1, arg10_1, arg11_1, arg12_1, arg13_1, arg14_1, arg15_1, arg16_1, arg17_1, arg18_1, arg19_1, arg20_1, arg21_1, arg22_1, arg23_1, arg24_1, arg25_1, arg26_1, arg27_1, arg28_1, arg29_1, arg30_1, arg31_1, arg32_1, arg33_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
