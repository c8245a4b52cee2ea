"""The FP8 byte layouts live with the kernels that read them (kernels/fp8.py); dsactl uses the same ones."""

from dsactl.kernels.fp8 import (E4M3_MAX, INDEX_HEAD_DIM, INDEX_PAGE_BYTES, INDEX_SCALE_OFFSET, MIN_SCALE,
                                MLA_CKV_DIM, MLA_KPE_DIM, MLA_KPE_OFFSET, MLA_NUM_SCALES, MLA_SCALE_GROUP,
                                MLA_SCALE_OFFSET, MLA_TOKEN_BYTES, PAGE_SIZE, dequantize_index_k, dequantize_mla_kv,
                                index_k_fp8_and_scales, quantize_index_k, quantize_mla_kv)

__all__ = ["E4M3_MAX", "INDEX_HEAD_DIM", "INDEX_PAGE_BYTES", "INDEX_SCALE_OFFSET", "MIN_SCALE", "MLA_CKV_DIM",
           "MLA_KPE_DIM", "MLA_KPE_OFFSET", "MLA_NUM_SCALES", "MLA_SCALE_GROUP", "MLA_SCALE_OFFSET", "MLA_TOKEN_BYTES",
           "PAGE_SIZE", "dequantize_index_k", "dequantize_mla_kv", "index_k_fp8_and_scales", "quantize_index_k",
           "quantize_mla_kv"]
