"""`apportion explain grain TYPE ID`: where a new activation would go now, and why."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_NOT_PLACED = 1
EXIT_ERROR = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="explain a placement decision",
        description="Explain a placement decision against what the operator published.",
    )
    kinds = parser.add_subparsers(dest="what", required=True, metavar="WHAT")
    grain = kinds.add_parser(
        "grain",
        help="which member a new activation of a grain would go to now",
        description="Reads the live placement tables of the namespace and says which member a "
        "new activation of grain ID (of grain type TYPE) would go to now: the GrainType that "
        "decides (its own or `default`), the members, what each filter removed, what the "
        "strategy excluded and the score of each candidate. Exit status 1 when no member "
        "would take it.",
    )
    add_grain_arguments(grain)
    grain.add_argument("--namespace", "-n", help="namespace (default: the kubeconfig's)")
    grain.set_defaults(func=run)


def add_grain_arguments(parser: argparse.ArgumentParser) -> None:
    """TYPE, ID and the options of `explain grain`, shared with `kubectl apportion explain
    grain` (whose --namespace is the plugin's own)."""
    parser.add_argument("grain_type", metavar="TYPE", help="grain type name, as workers know it")
    parser.add_argument("grain_id", metavar="ID", help="grain id")
    parser.add_argument(
        "--local", metavar="MEMBER", help="the member placing it (filters compare its labels)"
    )
    parser.add_argument("--hint", metavar="MEMBER", help="placement hint")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")


def run(args: argparse.Namespace) -> int:
    import asyncio

    return asyncio.run(explain_grain_command(args))


async def explain_grain_command(args: argparse.Namespace) -> int:
    from lightkube.core.exceptions import ApiError, ConfigError

    from apportion.grains._explain import explain_grain

    try:
        why = await explain_grain(
            args.grain_type,
            args.grain_id,
            namespace=args.namespace,
            local=args.local,
            hint=args.hint,
        )
    except (ApiError, ConfigError, OSError) as error:
        print(f"apportion explain: cannot read placement tables: {error}", file=sys.stderr)
        return EXIT_ERROR
    out = why.to_dict()
    if args.json:
        json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_explanation(out, local=args.local, hint=args.hint))
    return 0 if why.chosen is not None else EXIT_NOT_PLACED


def _detail(detail: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:g}" if isinstance(v, float | int) else f"{k}={v}" for k, v in detail.items()
    )


def format_explanation(out: dict[str, Any], *, local: str | None, hint: str | None) -> str:
    """The human form of `GrainExplanation.to_dict()`."""
    lines = [f"grain {out['grainId']!r} of type {out['grainType']!r}"]
    if out["graintype"] is None:
        lines.append(f"  not placed: {out['error']}")
        return "\n".join(lines) + "\n"
    via = " (the namespace default)" if out["viaDefault"] else ""
    lines.append(
        f"  decided by GrainType {out['graintype']}{via}, table version {out['tableVersion']}, "
        f"published {out['publishedAt']}"
    )
    if "strategy" in out:
        lines.append(
            f"  strategy {out['strategy']}; local member {local or '-'}; hint {hint or '-'}"
        )
    lines.append(f"  -> {out['chosen']}" if out["chosen"] else f"  not placed: {out['error']}")
    members = out.get("members") or []
    lines.append(f"members ({len(members)}): {' '.join(members) or '-'}")
    for step in out.get("filters") or []:
        removed = ", ".join(step["removed"]) or "nothing"
        lines.append(f"filter {step['filter']}: kept {len(step['kept'])}, removed {removed}")
    for member, reason in (out.get("excluded") or {}).items():
        lines.append(f"excluded {member}: {reason}")
    candidates = out.get("candidates") or []
    if candidates:
        width = max(len("MEMBER"), *(len(c["member"]) for c in candidates))
        lines.append(f"{'MEMBER':<{width}}  {'SCORE':>10}  DETAIL")
        for c in candidates:
            score = "-" if c["score"] is None else f"{c['score']:.4g}"
            mark = "  <- chosen" if c["member"] == out["chosen"] else ""
            lines.append(f"{c['member']:<{width}}  {score:>10}  {_detail(c['detail'])}{mark}")
    lines.extend(f"note: {note}" for note in out.get("notes") or [])
    return "\n".join(lines) + "\n"
