"""Fetching weights before an engine starts: sources, downloads, the layout on disk.

- ``sources``: what a profile's model_path names (local, https:// URL, hf:// repository);
  the control plane validates profiles with it too.
- ``store``: where fetched weights live in a weights dir, and their metadata file.
- ``http``: one file, resumed with Range, in a worker thread.
- ``hub``: a Hugging Face repository as a list of files (huggingface_hub).
- ``fetcher``: the node's fetches, shared per source, bounded, cancellable, with progress.

docs/weights.md describes the behaviour. To add a kind of source, parse it in
``sources``, list its files in a module like ``hub``, and give it a branch in
``Fetcher._fetch``.
"""
