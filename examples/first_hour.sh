#!/usr/bin/env bash
# A new user's first commands with the bundled models only (nothing downloaded), on a real photo
# (examples/images/dog.jpg): what each says when the demo models cannot do what is asked.
# Run from the repository root after `make demo` (which makes .venv): bash examples/first_hour.sh
set -euo pipefail
PS=${PADDLE_SAM:-.venv/bin/paddle-sam}
OUT=${1:-outputs/first_hour}
PHOTO=examples/images/dog.jpg

$PS --version
echo "== segment --text 'a dog' with the bundled SAM 3 (it knows 30 synthetic phrases)"
$PS segment "$PHOTO" --text "a dog" -o "$OUT/text" --overwrite
echo "== segment a click with the bundled SAM v1"
$PS segment "$PHOTO" --point 330,300 -o "$OUT/click" --overwrite
echo "== everything with the bundled SAM v1"
$PS everything "$PHOTO" -o "$OUT/everything" --overwrite --quiet
echo "== the official checkpoints for real photos"
$PS download
