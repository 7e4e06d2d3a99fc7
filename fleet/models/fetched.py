"""Sources of files a node fetches, as rows name them: the rule a profile's weights and an
adapter's files share (``agentd.fetch.sources`` parses them; the node fetches them). It
changes when what a node can fetch, or how checksums name its files, does."""

from agentd.fetch import sources


def fetch_errors(text: str, sums, where: str, sums_where: str) -> dict[str, str]:
    """What is wrong with a source of files a node fetches (a profile's weights, an
    adapter's) and its checksums, by field; {} when nothing is."""
    errors = {}
    try:
        source = sources.parse(text or "")
    except sources.SourceError as exc:
        errors[where] = str(exc)
        source = None
    if problems := sources.check_sha256(sums):
        errors[sums_where] = "; ".join(problems)
    elif where in errors or not sums:
        pass  # the checksums are judged against a source once it is a valid one
    elif source is None:
        errors[sums_where] = (
            f"checksums are for files the node fetches: {where} must be an "
            "https:// URL or hf://org/name[/path][@revision]"
        )
    elif names := sorted(n for n in sums if not source.holds(n)):
        if source.kind == sources.URL:
            errors[sums_where] = (
                f"the URL fetches one file, {source.file_name}; not {', '.join(names)}"
            )
        else:
            errors[sums_where] = (
                f"{source.text} fetches only {source.path} (and what is under it or "
                f"split from it); not {', '.join(names)}: name files by their path "
                "in the repository"
            )
    return errors
