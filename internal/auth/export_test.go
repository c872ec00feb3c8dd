package auth

// IntrospectionFailedFor is introspectionFailedFor, for the tests.
const IntrospectionFailedFor = introspectionFailedFor
