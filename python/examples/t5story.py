"""Story 1's T5, shared by the examples that run it on Transformers (hf_stories.py under
DeepSpeed, hf_fsdp_stories.py under FSDP2): a small config (nothing is downloaded) and the
story's differentiable one-hot inputs, which it multiplies by the shared embedding matrix (that
line stays in each example, where the user's code has it: the agents name its place)."""
import torch
import torch.nn.functional as F

VOCAB = 64


def t5_config(layers):
    from transformers import T5Config

    return T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=layers,
                    num_decoder_layers=layers, num_heads=4, decoder_start_token_id=0,
                    pad_token_id=0, eos_token_id=1, dropout_rate=0.0)


def sampled_inputs(ids):
    """Story 1's differentiable one-hot encodings of the input (b, l, c)."""
    return F.one_hot(ids, VOCAB).to(torch.float32).requires_grad_()
