#!/usr/bin/env bash
# random_tokens: a token folder of 8M random GPT-2 ids at $RANDOM_TOKENS (/tmp/random-tokens), made once, for the
# device scripts that time training steps (throughput does not depend on the text).
#
#   source scripts/device/random_tokens.sh; random_tokens     (repository root)
RANDOM_TOKENS=/tmp/random-tokens
random_tokens() {
  [ -f "$RANDOM_TOKENS/manifest.json" ] || python3 -c "
import sys; sys.path.insert(0, 'scripts/bench')
from pathlib import Path
from train_throughput import random_token_folder
random_token_folder(Path('$RANDOM_TOKENS'), 8_000_000)"
}
