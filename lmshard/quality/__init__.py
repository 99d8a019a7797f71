"""Data quality: document filters (filters.py and the rule sets it names: gopher, repetition,
c4, language) and near-duplicate detection (MinHash signatures and LSH bands, minhash.py;
clusters and survivors, near.py)."""
