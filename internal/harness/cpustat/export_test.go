package cpustat

// Parse is parse, for tests.
var Parse = parse
