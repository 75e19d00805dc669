"""What a drafter ships, written once: a drafting module that hangs on a frozen model and is saved in a
folder of its own (config JSON + safetensors), so that one model file serves both plain and SBD decoding.

  config.py        the typed config base: read / write the JSON file, refuse bad fields in one line
  folder.py        the folder's tensor file: read, write, copy into the attached parameters
  attach.py        how a drafter hangs on a model and comes off (`model.sbd_<kind>`), and its switches
  gated.py         the gated update: the adapter's low-rank delta at the gated rows only
  adapter.py       the drafting adapter (gated low-rank updates, saved in peft's layout)
  sampler_head.py  the sampler head (lets the adapter's drafts see each other; saved beside it)

The vLLM plug-in reads the same folders through `adapter.read` / `sampler_head.read` and calls the same
`gated.gated_update`.
"""
