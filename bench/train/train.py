#!/usr/bin/python3
# train.py: trains hearth's demo model, a small llama (tied embeddings) on the King James Bible
# with a SentencePiece BPE vocabulary of its own, on CPU and deterministically from a seed.
# Writes the tokenizer (.model) and raw f32 weights (.hkw) that tests/mkmodel turns into GGUF.
"""Usage: train.py --out-dir DIR [--steps N] [--measure N] ...  (see --help)

The default shape is the committed demo model's (2.9M parameters); Makefile.am's TRAIN_DEMO
adds its schedule (5000 steps of 8 x 256 tokens, about ten passes over the training text,
bfloat16 products, one thread: about 40 minutes).

Held-out split: every 20th chapter of the whole Bible (chapters 20, 40, ... in canonical
order), about 5% of the text. Whole chapters, so no held-out verse shares a window with a
training verse; spread over every book, so held-out text has the mix of law, history,
poetry, prophecy and letters that training text has (holding out one book would measure a
single style, and the tokenizer would never have seen its names).
"""
import argparse
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F

HELDOUT_EVERY = 20
VERSE = re.compile(r'^([0-9]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$')


def corpus_chapters():
    """The KJV as a list of chapters, each a list of verse strings, from Debian's bible-kjv."""
    out = subprocess.run(['bible', '-f', 'Gen1:1-Rev22:21'], check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.decode('utf-8')
    chapters, key = [], None
    for line in out.splitlines():
        m = VERSE.match(line)
        if not m:
            raise SystemExit('train.py: unexpected line from bible: %r' % line[:80])
        k = (m.group(1), m.group(2))
        if k != key:
            chapters.append([])
            key = k
        chapters[-1].append(m.group(4).strip())
    if len(chapters) != 1189:  # the Protestant canon's chapter count: a check on the parse
        raise SystemExit('train.py: parsed %d chapters, expected 1189' % len(chapters))
    return chapters


def split_chapters(chapters):
    train = [c for i, c in enumerate(chapters) if (i + 1) % HELDOUT_EVERY]
    held = [c for i, c in enumerate(chapters) if (i + 1) % HELDOUT_EVERY == 0]
    return train, held


def train_tokenizer(train, prefix, vocab):
    # BPE (not unigram): llama.cpp's and hearth's SPM tokenizer merge by score, which
    # reproduces SentencePiece BPE exactly. Byte fallback makes every input encodable;
    # identity normalization keeps text as the tokenizers hearth/llama.cpp see it.
    verses = [v for c in train for v in c]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(verses), model_prefix=prefix, vocab_size=vocab,
        model_type='bpe', byte_fallback=True, character_coverage=1.0,
        normalization_rule_name='identity', add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=True, num_threads=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=prefix + '.model')


def write_vocab_tsv(sp, path):
    """The vocabulary for tests/mkmodel --spm-vocab: piece, score, llama.cpp token type
    (1 normal, 2 unknown, 3 control, 6 byte) a line, in id order."""
    with open(path, 'w', encoding='utf-8') as f:
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if '\t' in piece or '\n' in piece:
                raise SystemExit('train.py: piece %d holds a tab or newline' % i)
            kind = (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
            f.write('%s\t%r\t%d\n' % (piece, sp.get_score(i), kind))


def write_text(chapters, path):
    """One chapter a line, verses joined by spaces: the text the model was trained on."""
    with open(path, 'w', encoding='utf-8') as f:
        for c in chapters:
            f.write(' '.join(c) + '\n')


def encode(sp, chapters):
    """One stream: each chapter is a document, BOS then its verses joined by spaces."""
    ids = []
    for c in chapters:
        ids.append(sp.bos_id())
        ids.extend(sp.encode(' '.join(c)))
    return np.array(ids, dtype=np.int64)


class Llama(torch.nn.Module):
    """llama as llama.cpp runs it: RMSNorm, RoPE on adjacent pairs (ROPE_NORM), SwiGLU, GQA,
    tied embeddings. Weight names and shapes are GGUF's (rows = output features)."""

    def __init__(self, a):
        super().__init__()
        self.a = a
        hd = a.dim // a.heads
        p = {}
        std = 0.02
        p['token_embd.weight'] = torch.nn.Parameter(torch.randn(a.vocab, a.dim) * std)
        for i in range(a.layers):
            b = 'blk.%d.' % i
            p[b + 'attn_norm.weight'] = torch.nn.Parameter(torch.ones(a.dim))
            p[b + 'attn_q.weight'] = torch.nn.Parameter(torch.randn(a.heads * hd, a.dim) * std)
            p[b + 'attn_k.weight'] = torch.nn.Parameter(torch.randn(a.kv_heads * hd, a.dim) * std)
            p[b + 'attn_v.weight'] = torch.nn.Parameter(torch.randn(a.kv_heads * hd, a.dim) * std)
            # Residual projections scaled down by depth (GPT-2's rule) so early steps are stable.
            p[b + 'attn_output.weight'] = torch.nn.Parameter(
                torch.randn(a.dim, a.heads * hd) * std / math.sqrt(2 * a.layers))
            p[b + 'ffn_norm.weight'] = torch.nn.Parameter(torch.ones(a.dim))
            p[b + 'ffn_gate.weight'] = torch.nn.Parameter(torch.randn(a.ff, a.dim) * std)
            p[b + 'ffn_up.weight'] = torch.nn.Parameter(torch.randn(a.ff, a.dim) * std)
            p[b + 'ffn_down.weight'] = torch.nn.Parameter(
                torch.randn(a.dim, a.ff) * std / math.sqrt(2 * a.layers))
        p['output_norm.weight'] = torch.nn.Parameter(torch.ones(a.dim))
        # a plain dict, kept in order: ParameterDict forbids '.' in keys
        self.names = list(p.keys())
        self.p = torch.nn.ParameterList([p[k] for k in self.names])
        self.w = dict(zip(self.names, self.p))
        inv = a.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.arange(a.seq, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer('cos', torch.cos(ang), persistent=False)
        self.register_buffer('sin', torch.sin(ang), persistent=False)
        self.register_buffer('mask', torch.full((a.seq, a.seq), float('-inf')).triu(1),
                             persistent=False)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.a.eps) * w

    def rope(self, x, T):
        # x [B, H, T, hd]: pairs (2i, 2i+1) rotate by angle pos * theta^(-2i/hd)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = self.cos[:T], self.sin[:T]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    def forward(self, idx):
        a, w = self.a, self.w
        B, T = idx.shape
        hd = a.dim // a.heads
        rep = a.heads // a.kv_heads
        x = F.embedding(idx, w['token_embd.weight'])
        for i in range(a.layers):
            b = 'blk.%d.' % i
            h = self.rms(x, w[b + 'attn_norm.weight'])
            q = (h @ w[b + 'attn_q.weight'].t()).view(B, T, a.heads, hd).transpose(1, 2)
            k = (h @ w[b + 'attn_k.weight'].t()).view(B, T, a.kv_heads, hd).transpose(1, 2)
            v = (h @ w[b + 'attn_v.weight'].t()).view(B, T, a.kv_heads, hd).transpose(1, 2)
            q, k = self.rope(q, T), self.rope(k, T)
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + self.mask[:T, :T]
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, a.heads * hd)
            x = x + o @ w[b + 'attn_output.weight'].t()
            h = self.rms(x, w[b + 'ffn_norm.weight'])
            g = F.silu(h @ w[b + 'ffn_gate.weight'].t()) * (h @ w[b + 'ffn_up.weight'].t())
            x = x + g @ w[b + 'ffn_down.weight'].t()
        x = self.rms(x, w['output_norm.weight'])
        return x @ w['token_embd.weight'].t()


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def evaluate(model, held, a, max_windows):
    """Held-out loss (nats/token), perplexity and median top-token probability, over
    non-overlapping windows of the held-out stream."""
    model.eval()
    losses, tops = [], []
    n = (len(held) - 1) // a.seq
    with torch.no_grad():
        for i in range(min(n, max_windows)):
            x = torch.from_numpy(held[i * a.seq:(i + 1) * a.seq])[None]
            y = torch.from_numpy(held[i * a.seq + 1:(i + 1) * a.seq + 1])[None]
            logp = model(x).log_softmax(-1)[0]
            losses.append(-logp.gather(1, y[0][:, None])[:, 0])
            tops.append(logp.max(-1).values.exp())
    model.train()
    loss = torch.cat(losses).mean().item()
    return loss, math.exp(loss), torch.cat(tops).median().item(), sum(len(t) for t in tops)


def greedy(model, sp, prompt, n, a):
    model.eval()
    ids = [sp.bos_id()] + sp.encode(prompt)
    with torch.no_grad():
        for _ in range(n):
            ctx = torch.tensor([ids[-a.seq:]])
            ids.append(int(model(ctx)[0, -1].argmax()))
    model.train()
    return sp.decode(ids[1:])


def save_weights(model, path):
    """.hkw: 'HKW1', u32 count, then per tensor u32 name length, name, u32 rows, u32 cols
    (cols 1 for vectors), f32 little-endian data row-major -- GGUF's layout for the tensor."""
    with open(path + '.tmp', 'wb') as f:
        f.write(b'HKW1' + struct.pack('<I', len(model.names)))
        for k in model.names:
            t = model.w[k].detach().float().contiguous()
            rows, cols = (t.shape[0], t.shape[1]) if t.dim() == 2 else (t.shape[0], 1)
            f.write(struct.pack('<I', len(k)) + k.encode() + struct.pack('<II', rows, cols))
            f.write(t.numpy().astype('<f4').tobytes())
    os.replace(path + '.tmp', path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--out-dir', required=True)
    ap.add_argument('--name', default='hearth-kjv')
    ap.add_argument('--seed', type=int, default=17)
    ap.add_argument('--vocab', type=int, default=2048)
    ap.add_argument('--dim', type=int, default=256)
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--kv-heads', type=int, default=2)
    ap.add_argument('--ff', type=int, default=512)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--steps', type=int, default=560)
    ap.add_argument('--warmup', type=int, default=40)
    ap.add_argument('--lr', type=float, default=3e-3)
    ap.add_argument('--wd', type=float, default=0.1)
    ap.add_argument('--rope-theta', type=float, default=10000.0)
    ap.add_argument('--eps', type=float, default=1e-5)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--eval-every', type=int, default=200)
    ap.add_argument('--tokenizer', metavar='PATH',
                    help='reuse this SentencePiece .model instead of training one (a model that '
                    'shares the demo\'s tokenizer can draft for it, or be drafted by it)')
    ap.add_argument('--bf16', action='store_true',
                    help='matrix products in bfloat16 (autocast; weights, optimizer state and '
                    'the loss stay f32): ~2.5x the f32 matmul rate on CPUs with AVX512-BF16')
    ap.add_argument('--measure', type=int, default=0,
                    help='time this many steps, print steps/s, and exit (to size --steps)')
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.out_dir, exist_ok=True)
    prefix = os.path.join(a.out_dir, a.name)

    chapters = corpus_chapters()
    train_ch, held_ch = split_chapters(chapters)
    if a.tokenizer:
        if os.path.abspath(a.tokenizer) != os.path.abspath(prefix + '.model'):
            shutil.copyfile(a.tokenizer, prefix + '.model')
        sp = spm.SentencePieceProcessor(model_file=prefix + '.model')
        if sp.get_piece_size() != a.vocab:
            raise SystemExit('train.py: %s has %d pieces, --vocab is %d'
                             % (a.tokenizer, sp.get_piece_size(), a.vocab))
    else:
        sp = train_tokenizer(train_ch, prefix, a.vocab)
    write_vocab_tsv(sp, prefix + '.vocab.tsv')
    write_text(held_ch, prefix + '-heldout.txt')
    train, held = encode(sp, train_ch), encode(sp, held_ch)
    print('corpus: %d chapters train (%d tokens), %d held out (every %dth, %d tokens)'
          % (len(train_ch), len(train), len(held_ch), HELDOUT_EVERY, len(held)), flush=True)
    np.save(prefix + '-heldout.npy', held.astype(np.int32))

    # The shape for tests/mkmodel, written where the weights are so the two cannot disagree.
    with open(prefix + '.mkmodel-args', 'w') as f:
        f.write('--arch llama --n-embd %d --n-layer %d --n-head %d --n-head-kv %d --n-ff %d '
                '--ctx %d --rope-theta %g --rms-eps %g --tied --spm-vocab %s.vocab.tsv '
                '--weights %s.hkw\n' % (a.dim, a.layers, a.heads, a.kv_heads, a.ff, a.seq,
                                        a.rope_theta, a.eps, prefix, prefix))
    model = Llama(a)
    n_params = sum(p.numel() for p in model.parameters())
    print('model: llama dim %d layers %d heads %d/%d ff %d vocab %d seq %d: %.2fM params'
          % (a.dim, a.layers, a.heads, a.kv_heads, a.ff, a.vocab, a.seq, n_params / 1e6), flush=True)
    decay = [p for k, p in model.w.items() if not k.endswith('norm.weight')]
    nodecay = [p for k, p in model.w.items() if k.endswith('norm.weight')]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': a.wd},
                             {'params': nodecay, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(a.seed)
    steps = a.measure or a.steps
    t0 = time.time()
    for step in range(steps):
        starts = rng.integers(0, len(train) - a.seq - 1, a.batch)
        xb = torch.from_numpy(np.stack([train[s:s + a.seq] for s in starts]))
        yb = torch.from_numpy(np.stack([train[s + 1:s + a.seq + 1] for s in starts]))
        for g in opt.param_groups:
            g['lr'] = lr_at(step, a)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(xb)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), yb.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            el = time.time() - t0
            print('step %d/%d loss %.3f lr %.2e %.2f steps/s' %
                  (step, steps, loss.item(), lr_at(step, a), (step + 1) / el), flush=True)
        if a.eval_every and step and step % a.eval_every == 0 and not a.measure:
            l, ppl, top, n = evaluate(model, held, a, 8)
            print('  held-out (partial, %d positions): loss %.3f ppl %.1f median top %.3f'
                  % (n, l, ppl, top), flush=True)
            save_weights(model, prefix + '.hkw')
    if a.measure:
        print('measure: %.3f steps/s' % (steps / (time.time() - t0)))
        return
    save_weights(model, prefix + '.hkw')
    l, ppl, top, n = evaluate(model, held, a, 10 ** 9)
    print('held-out: %d positions, loss %.4f nats/token, perplexity %.2f, median top-token '
          'probability %.3f' % (n, l, ppl, top))
    for prompt in ('In the beginning', 'And the LORD said unto Moses,', 'Blessed are the',
                   'The LORD is my shepherd;'):
        print('greedy: %s' % greedy(model, sp, prompt, 40, a).replace('\n', ' '))
    print('train: %.0f s wall' % (time.time() - t0))


if __name__ == '__main__':
    main()
