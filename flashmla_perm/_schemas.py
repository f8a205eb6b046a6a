"""Op schemas for the Python fallback; csrc/ops.cpp defines the same strings
(tests/test_ops.py checks that they agree)."""

SCHEMAS = {
    "permute_rows_": "permute_rows_(Tensor(a!) self, Tensor perm) -> ()",
    "permute_cols_": "permute_cols_(Tensor(a!) self, Tensor perm) -> ()",
    "permute_cols": "permute_cols(Tensor self, Tensor perm) -> Tensor",
    "permute_wq_b_": "permute_wq_b_(Tensor(a!) weight, Tensor(b!) weight_scale, int num_local_heads, bool inverse=False) -> ()",
    "permute_wo_a_": "permute_wo_a_(Tensor(a!) weight, Tensor(b!) weight_scale, int heads_per_group=8, bool inverse=False) -> ()",
    "permute_q": "permute_q(Tensor q, bool inverse=False) -> Tensor",
    "permute_": "permute_(Tensor(a!) self, Tensor perm, int dim=0) -> ()",
    "permute_q_b_proj": "permute_q_b_proj(Tensor[] weight_and_scale, int h_q, int d_q) -> Tensor[]",
    "permute_wv_proj": "permute_wv_proj(Tensor[] weight_and_scale, int wv_group_size, int d_o) -> Tensor[]",
}
