"""Which Slurm account each job goes to, checked at `snakemake -n` against the user's
associations (``sacctmgr``, one query: slurm.user_accounts), as sbatch and the site's submit
plugin will check it:

- slurm.account (or $SLURM_ACCOUNT) that is one of them: every job goes to it;
- else where the site lists ``<account>_cpu`` / ``<account>_gpu`` (Alliance's RAC style), a
  CPU job goes to the first, a GPU job to the second;
- no account given: the user's only one (a ``_cpu``/``_gpu`` pair counts as one); with
  several, the user chooses, as Alliance sites refuse a job without --account.
Anything else is refused naming the user's accounts. No torch here."""

from __future__ import annotations

SPLIT = {False: "_cpu", True: "_gpu"}  # a job on GPUs or not -> the account's suffix


def family(account: str) -> str:
    """def-pi_cpu and def-pi_gpu are def-pi's."""
    for suffix in SPLIT.values():
        if account.endswith(suffix):
            return account[: -len(suffix)]
    return account


def choices(accounts) -> str:
    """The accounts as the user may name them: def-pi (def-pi_cpu, def-pi_gpu), root."""
    families: dict[str, list[str]] = {}
    for account in accounts:
        families.setdefault(family(account), []).append(account)
    return ", ".join(name if members == [name] else f"{name} ({', '.join(members)})"
                     for name, members in families.items())


def job_accounts(given: str, accounts, kinds: set[bool]) -> tuple[dict[bool, str], str]:
    """({on GPUs: account} for the kinds of job the plan submits, a line to log); raises
    ValueError (one line, the way out) where sbatch would refuse them."""
    listed = ", ".join(accounts)
    if not accounts:
        raise ValueError("sacctmgr lists no Slurm account of yours: sbatch would refuse every "
                         "job; ask your PI to sponsor you (on Alliance: CCDB), then set "
                         "slurm.account")
    if not given:
        families = list(dict.fromkeys(map(family, accounts)))
        if len(families) > 1:
            raise ValueError(
                f"slurm.account is not set and you have several Slurm accounts (sacctmgr: "
                f"{listed}): set slurm.account in config/config.yaml (or $SLURM_ACCOUNT) to "
                f"one of {choices(accounts)}; sites refuse a job without one")
        given = families[0]
    if given in accounts:
        return {kind: given for kind in kinds}, f"slurm account: {given} (sacctmgr: {listed})"
    mapped = {kind: given + SPLIT[kind] for kind in kinds}
    missing = [a for a in mapped.values() if a not in accounts]
    if not any(given + s in accounts for s in SPLIT.values()) or missing:
        lack = f" (no {', '.join(missing)})" if any(a in accounts for a in mapped.values()) else ""
        raise ValueError(
            f"slurm.account {given} is not one of your Slurm accounts (sacctmgr: {listed})"
            f"{lack}: sbatch would refuse every job; set slurm.account in config/config.yaml "
            f"(or $SLURM_ACCOUNT) to one of {choices(accounts)}")
    return mapped, ("slurm account: " + ", ".join(
        f"{'GPU' if kind else 'CPU'} jobs on {mapped[kind]}" for kind in sorted(kinds))
        + f" (slurm.account {given}; the site lists {listed})")
