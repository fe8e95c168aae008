package uri

// NormalizeFull is Normalize without its fast path for URIs already in normal form.
var NormalizeFull = normalize

// AlreadyNormal reports whether Normalize takes its fast path for raw.
var AlreadyNormal = alreadyNormal
