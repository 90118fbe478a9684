"""Drop-in tests: client code written for the official packages, run on paddle-sam."""
