"""Data quality: near-duplicate detection (MinHash with LSH bands, minhash.py)."""
