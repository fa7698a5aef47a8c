#!/usr/bin/python3
# calib_text.py: calibration text for an importance matrix (llama-imatrix) of the trained
# models: training chapters only, spread over the Bible like the held-out split, so the
# statistics never see the text fidelity is measured on.
"""Usage: calib_text.py OUT.txt [--every N]

Writes chapters 10, 30, 50, ... (every N-th from the 10th, canonical order; all of them
training chapters, since train.py holds out chapters 20, 40, ...) one a line, verses joined
by spaces: the form train.py writes its held-out text in.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import HELDOUT_EVERY, corpus_chapters, write_text  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('out')
    ap.add_argument('--every', type=int, default=HELDOUT_EVERY)
    a = ap.parse_args()
    chapters = corpus_chapters()
    pick = [c for i, c in enumerate(chapters)
            if (i + 1) % a.every == a.every // 2 and (i + 1) % HELDOUT_EVERY]
    write_text(pick, a.out)
    print('calib_text: %d training chapters -> %s' % (len(pick), a.out))


if __name__ == '__main__':
    main()
