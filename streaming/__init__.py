"""The data path, in packages by stage, each importing only those below it: kernels, source, decode, write,
table, read, maintenance, job; contract/ and storage.py are seen by every stage."""
