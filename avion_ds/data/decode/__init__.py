"""Video decoding: backends (decord, torchcodec, PyAV), their registry, the choice between them
(``select``) and the timeout helper process."""
