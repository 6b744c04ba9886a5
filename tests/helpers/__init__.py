"""What several test folders share: engines and collectors, tiny models, scripted clients and
servers, protocol checks, frame builders, recorded traffic and the repository's paths."""
