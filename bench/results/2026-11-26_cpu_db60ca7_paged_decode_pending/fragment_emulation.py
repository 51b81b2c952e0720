"""Warp-level emulation of heads_as_n.mbox's ring-kernel step (one warp, 32 lanes, lane = 4 g + c),
checking its fragment index math against a direct base-2 softmax attention in float64.

It models the PTX fragment layouts the kernel relies on: ldmatrix.x4 (lane L addresses row L % 8
of matrix L / 8; lane (g, c) receives row g, columns 2c, 2c + 1 of each matrix, or with .trans
rows 2c, 2c + 1 of column g), mma.m16n8k16 (A rows g, g + 8 by columns 2c.. and 2c + 8..; B
rows 2c.., 2c + 8.. by column g; C rows g, g + 8 by columns 2c, 2c + 1), movmatrix.trans (lane
(g, c) gets rows 2c, 2c + 1 of column g) and shfl_xor, and runs the kernel's loop with the
kernel's own index expressions (ld_k_row / ld_k_chunk, ld_v_row / ld_v_chunk, the masks, the
online softmax, the epilogue). Rounding to bf16 is left out: this checks where values go.

    python3 fragment_emulation.py      # prints max |out - ref| and max |lse - ref| per case (~1e-16)
"""
import numpy as np
rng = np.random.default_rng(0)

def lanes():
    return [(L >> 2, L & 3) for L in range(32)]

def ldmatrix_x4(addr, data, trans):
    # addr[L] = (row, chunk); data[row][chunk*8:(chunk+1)*8]; returns regs[L][i] = (lo, hi)
    mats = []
    for i in range(4):
        mats.append(np.array([data[addr[8*i+q][0]][addr[8*i+q][1]*8:(addr[8*i+q][1]+1)*8] for q in range(8)]))
    regs = []
    for L, (g, c) in enumerate(lanes()):
        r = []
        for i in range(4):
            M = mats[i]
            r.append((M[2*c][g], M[2*c+1][g]) if trans else (M[g][2*c], M[g][2*c+1]))
        regs.append(r)
    return regs

def mma(C, A, B0, B1):
    # C[L] = [c0..c3]; A[L] = [(lo,hi)]*4; B0[L], B1[L] = (lo, hi)
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8)); Cm = np.zeros((16, 8))
    for L, (g, c) in enumerate(lanes()):
        a = A[L]
        Am[g][2*c], Am[g][2*c+1] = a[0]; Am[g+8][2*c], Am[g+8][2*c+1] = a[1]
        Am[g][2*c+8], Am[g][2*c+9] = a[2]; Am[g+8][2*c+8], Am[g+8][2*c+9] = a[3]
        Bm[2*c][g], Bm[2*c+1][g] = B0[L]; Bm[2*c+8][g], Bm[2*c+9][g] = B1[L]
        Cm[g][2*c], Cm[g][2*c+1], Cm[g+8][2*c], Cm[g+8][2*c+1] = C[L]
    D = Am @ Bm + Cm
    return [[D[g][2*c], D[g][2*c+1], D[g+8][2*c], D[g+8][2*c+1]] for (g, c) in lanes()]

def movmatrix_trans(regs):
    M = np.zeros((8, 8))
    for L, (g, c) in enumerate(lanes()):
        M[g][2*c], M[g][2*c+1] = regs[L]
    return [(M[2*c][g], M[2*c+1][g]) for (g, c) in lanes()]

def shuffle_transpose(regs):
    """shuffle_transpose.mbox's stand-in for movmatrix.trans: two shuffles and a byte permute."""
    out = []
    for L, (g, c) in enumerate(lanes()):
        top, bottom = regs[8 * c + (g >> 1)], regs[8 * c + 4 + (g >> 1)]
        out.append((top[g & 1], bottom[g & 1]))
    return out


def shfl_xor(vals, m):
    return [vals[L ^ m] for L in range(32)]

def run(D, G, HT, steps, n_tokens):
    Q = rng.standard_normal((G, D))
    K = rng.standard_normal((steps * 16, D)); V = rng.standard_normal((steps * 16, D))
    scale = 0.1
    rows = G
    # qb[j][nt][L] = (b0, b1) with b = (lo, hi)
    qb = [[[None]*32 for _ in range(HT)] for _ in range(D // 16)]
    for j in range(D // 16):
        for nt in range(HT):
            for L, (g, c) in enumerate(lanes()):
                h = 8*nt + g
                if h < rows:
                    b0 = (Q[h][16*j+2*c], Q[h][16*j+2*c+1]); b1 = (Q[h][16*j+8+2*c], Q[h][16*j+8+2*c+1])
                else:
                    b0 = b1 = (0.0, 0.0)
                qb[j][nt][L] = (b0, b1)
    o = [[[[0.0]*4 for _ in range(32)] for _ in range(HT)] for _ in range(D // 16)]
    m = [[[-np.inf]*32 for _ in range(2)] for _ in range(HT)]
    l = [[[0.0]*32 for _ in range(2)] for _ in range(HT)]
    ld_k = [(((L >> 3) & 1) * 8 + (L & 7), L >> 4) for L in range(32)]
    ld_v = [(16 + (L >> 4) * 8 + (L & 7), (L >> 3) & 1) for L in range(32)]
    for s in range(steps):
        t0 = s * 16
        stage = np.concatenate([K[t0:t0+16], V[t0:t0+16]])  # rows 0-15 K, 16-31 V
        acc = [[[[0.0]*4 for _ in range(32)] for _ in range(HT)] for _ in range(2)]
        for j in range(D // 16):
            ka = ldmatrix_x4([(r, 2*j + ch) for (r, ch) in ld_k], stage, False)
            for nt in range(HT):
                acc[j & 1][nt] = mma(acc[j & 1][nt], ka, [qb[j][nt][L][0] for L in range(32)],
                                     [qb[j][nt][L][1] for L in range(32)])
        sc = [[[acc[0][nt][L][e] + acc[1][nt][L][e] for e in range(4)] for L in range(32)] for nt in range(HT)]
        alpha = [[[0.0]*32 for _ in range(2)] for _ in range(HT)]
        for nt in range(HT):
            for h in range(2):
                lo = []; hi = []
                for L, (g, c) in enumerate(lanes()):
                    lo.append(sc[nt][L][h] * scale if t0 + g < n_tokens else -np.inf)
                    hi.append(sc[nt][L][2+h] * scale if t0 + g + 8 < n_tokens else -np.inf)
                mx = [max(a, b) for a, b in zip(lo, hi)]
                for msk in (4, 8, 16):
                    sh = shfl_xor(mx, msk); mx = [max(a, b) for a, b in zip(mx, sh)]
                for L in range(32):
                    m_new = max(m[nt][h][L], mx[L]); base = 0.0 if m_new == -np.inf else m_new
                    alpha[nt][h][L] = 2.0 ** (m[nt][h][L] - base)
                    lo[L] = 2.0 ** (lo[L] - base); hi[L] = 2.0 ** (hi[L] - base)
                    l[nt][h][L] = l[nt][h][L] * alpha[nt][h][L] + lo[L] + hi[L]
                    m[nt][h][L] = m_new
                    sc[nt][L][h] = lo[L]; sc[nt][L][2+h] = hi[L]
        pb = [[movmatrix_trans([(sc[nt][L][0], sc[nt][L][1]) for L in range(32)]),
               movmatrix_trans([(sc[nt][L][2], sc[nt][L][3]) for L in range(32)])] for nt in range(HT)]
        for i in range(D // 16):
            va = ldmatrix_x4([(r, 2*i + ch) for (r, ch) in ld_v], stage, True)
            for nt in range(HT):
                acc_o = o[i][nt]
                for L in range(32):
                    acc_o[L] = [acc_o[L][0]*alpha[nt][0][L], acc_o[L][1]*alpha[nt][1][L],
                                acc_o[L][2]*alpha[nt][0][L], acc_o[L][3]*alpha[nt][1][L]]
                o[i][nt] = mma(acc_o, va, pb[nt][0], pb[nt][1])
    for nt in range(HT):
        for h in range(2):
            v = l[nt][h]
            for msk in (4, 8, 16):
                sh = shfl_xor(v, msk); v = [a + b for a, b in zip(v, sh)]
            l[nt][h] = v
    out = np.full((G, D), np.nan); lse = np.full(G, np.nan)
    for nt in range(HT):
        for h in range(2):
            for L, (g, c) in enumerate(lanes()):
                row = 8*nt + 2*c + h
                if row >= rows:
                    continue
                inv = 1.0 / l[nt][h][L]
                for i in range(D // 16):
                    out[row][16*i+g] = o[i][nt][L][h] * inv
                    out[row][16*i+g+8] = o[i][nt][L][2+h] * inv
                if g == 0:
                    lse[row] = m[nt][h][L] + np.log2(l[nt][h][L])
    # reference
    logits = (Q @ K[:n_tokens].T) * scale  # base-2 logits
    mref = logits.max(axis=1, keepdims=True)
    p = 2.0 ** (logits - mref)
    ref = (p @ V[:n_tokens]) / p.sum(axis=1, keepdims=True)
    lse_ref = mref[:, 0] + np.log2(p.sum(axis=1))
    return np.abs(out - ref).max(), np.abs(lse - lse_ref).max()

for D, G, HT, steps, n in [(128, 4, 1, 3, 40), (128, 8, 1, 2, 32), (64, 5, 1, 2, 17), (128, 16, 2, 2, 29), (64, 12, 2, 3, 48), (128, 1, 1, 1, 1)]:
    err_out, err_lse = run(D, G, HT, steps, n)
    print(f"D={D} G={G} head tiles={HT} steps={steps} tokens={n}: max |out - ref| {err_out:.1e}, max |lse - ref| {err_lse:.1e}")

regs = [tuple(rng.standard_normal(2)) for _ in range(32)]
print("shuffle transpose == movmatrix.trans:", shuffle_transpose(regs) == movmatrix_trans(regs))
