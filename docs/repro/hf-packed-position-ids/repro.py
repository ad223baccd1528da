"""Packed sequences through position_ids: GptOssModel and BertModel (as a decoder) attend
across sequence boundaries, LlamaModel does not.

Padding-free packing hands a model several sequences back to back in one row, with
position_ids restarting at each sequence and no attention_mask; transformers' causal masks
find the sequences from the positions (masking_utils.find_packed_sequence_indices) when the
model passes position_ids to create_causal_mask. The second sequence of a packed row must
then come out exactly as it does alone.
"""

import torch
import transformers
from transformers import BertConfig, GptOssConfig, LlamaConfig

torch.manual_seed(0)
E, H, n = 32, 4, 4
common = dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=1, vocab_size=8,
              intermediate_size=2 * E)
configs = {
    "LlamaModel": LlamaConfig(num_key_value_heads=H, **common),
    "GptOssModel": GptOssConfig(num_key_value_heads=H, head_dim=E // H, num_local_experts=2,
                                num_experts_per_tok=1, sliding_window=64,
                                layer_types=["full_attention"], **common),
    "BertModel (is_decoder)": BertConfig(is_decoder=True, **common),
}
x = torch.randn(1, 2 * n, E)  # float32 (GptOss experts take no float64)
packed_positions = torch.cat([torch.arange(n), torch.arange(n)])[None]
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
for name, config in configs.items():
    model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        both = model(inputs_embeds=x, position_ids=packed_positions, use_cache=False)
        alone = model(inputs_embeds=x[:, n:], position_ids=torch.arange(n)[None],
                      use_cache=False)
    diff = (both.last_hidden_state[:, n:] - alone.last_hidden_state).abs().max().item()
    print(f"{name}: second sequence packed vs alone, max abs difference {diff:.3g}"
          f" ({'as alone' if diff < 1e-5 else 'attends the first sequence'})")
