"""``hf-rope-ext push SRC --repo-id NAME``: upload a model or adapter directory with its model card."""

from __future__ import annotations

import sys

from .args import progress_argument


def add_parser(subparsers, name):
    parser = subparsers.add_parser(
        name,
        help="upload a model or adapter directory to the Hugging Face Hub",
        description=(
            "Upload what a reader needs from SRC: its top-level files (weights or adapter, config, tokenizer, card, "
            "evaluation, plots), never subfolders (a run's checkpoints/, logs/, merged/: push RUN/merged on its "
            "own) nor training state. The file list is printed first."
        ),
    )
    parser.add_argument("src", help="saved model or peft adapter directory (only read)")
    parser.add_argument("--repo-id", required=True, help="'name' or 'owner/name' on the Hub")
    parser.add_argument(
        "--base-model-id",
        metavar="OWNER/NAME",
        help="Hub id of the base model, required when SRC names it by a local path; written into the uploaded "
        "adapter_config.json and card",
    )
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--dry-run", metavar="DIR", help="write exactly what would be uploaded to DIR; upload nothing")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an existing --dry-run DIR, replacing only the files a dry run writes",
    )
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    progress_argument(parser)
    return parser


def run(args) -> int:
    from ..publish.hub import HubError, push  # torch: loaded when the command runs

    try:
        where = push(
            args.src,
            args.repo_id,
            private=args.private,
            dry_run=args.dry_run,
            overwrite=args.overwrite,
            token=args.token,
            base_model_id=args.base_model_id,
            report=lambda line: print(line, flush=True),
        )
    except HubError as err:
        print(f"hf-rope-ext push: error: {err}", file=sys.stderr)
        return 1
    print(f"{'dry run, nothing uploaded: wrote' if args.dry_run else 'pushed:'} {where}")
    return 0
