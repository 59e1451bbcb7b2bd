"""The artifact store: every step's output keyed by its content (`artifacts`), the keys'
hashes (`hashing`), and keeping the store's size bounded (`gc`)."""
