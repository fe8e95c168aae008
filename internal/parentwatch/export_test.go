package parentwatch

// Alive reports whether process pid exists and has not exited, as the portable watch sees it.
var Alive = alive
