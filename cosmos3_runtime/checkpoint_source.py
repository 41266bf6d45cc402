"""Where a checkpoint comes from: a local folder or the Hugging Face Hub.

Accepted forms:

- a local folder in diffusers layout (``/models/cosmos3-policy``);
- a Hub id, ``nvidia/Cosmos3-Policy``, optionally with a revision: ``nvidia/Cosmos3-Policy@v1.1``;
- a Hub id with a subfolder that holds the diffusers layout: ``nvidia/Cosmos3-Policy/distilled``.

Downloads go through ``huggingface_hub`` (its cache, its progress bars, its token handling). When the
Hub cannot be reached or offline mode is on and the files are not cached, the error names the id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError


@dataclass(frozen=True)
class CheckpointSource:
    """A parsed checkpoint reference."""

    original: str
    local_path: Path | None = None
    repo_id: str | None = None
    subfolder: str | None = None
    revision: str | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None

    @classmethod
    def parse(cls, source: str | Path, revision: str | None = None) -> CheckpointSource:
        text = str(source)
        path = Path(text).expanduser()
        if path.exists():
            if not path.is_dir():
                raise CheckpointError(f"checkpoint {text!r} is a file; expected a folder in diffusers layout")
            return cls(original=text, local_path=path.resolve())
        if text.startswith((".", "/", "~")) or "\\" in text:
            raise CheckpointError(f"checkpoint folder {text!r} does not exist")
        if "@" in text:
            text, _, at_revision = text.partition("@")
            if revision is not None and revision != at_revision:
                raise CheckpointError(f"two revisions given for {source!r}: {at_revision!r} and {revision!r}")
            revision = at_revision or None
        parts = [p for p in text.split("/") if p]
        if len(parts) < 2:
            raise CheckpointError(
                f"{str(source)!r} is neither an existing folder nor a Hub id of the form 'namespace/repo'"
            )
        return cls(
            original=str(source),
            repo_id="/".join(parts[:2]),
            subfolder="/".join(parts[2:]) or None,
            revision=revision,
        )

    def resolve(self, config_only: bool = False) -> Path:
        """Return a local folder holding the checkpoint, downloading it from the Hub if needed.

        ``config_only`` fetches only the small files (configs, tokenizer, index files), which is all
        inspection needs.
        """
        if self.local_path is not None:
            return self.local_path
        assert self.repo_id is not None, "parse() sets a local path or a repository"
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

        prefix = f"{self.subfolder}/" if self.subfolder else ""
        allow = [f"{prefix}*.json", f"{prefix}**/*.json", f"{prefix}**/*.txt", f"{prefix}**/*.model"]
        if not config_only:
            allow = [f"{prefix}*", f"{prefix}**"]
        try:
            root = snapshot_download(self.repo_id, revision=self.revision, allow_patterns=allow)
        except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
            raise CheckpointError(
                f"checkpoint {self.original!r} is not in the local Hugging Face cache and the Hub cannot be "
                f"reached (offline mode or no network): download it first or pass a local folder ({exc})"
            ) from exc
        except Exception as exc:  # repository not found, gated, revision missing, HTTP errors
            raise CheckpointError(f"could not fetch checkpoint {self.original!r} from the Hub: {exc}") from exc
        path = Path(root) / self.subfolder if self.subfolder else Path(root)
        if not path.is_dir():
            raise CheckpointError(f"subfolder {self.subfolder!r} not found in Hub repository {self.repo_id!r}")
        return path
