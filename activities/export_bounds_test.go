package activities

// BoundError exposes boundError to the external tests.
var BoundError = boundError
