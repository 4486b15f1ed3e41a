"""A client of the sidecar's wire protocol in Python, for the tests that must say on the wire
what no real client would: forged buffer references, scribbled rings, stolen fd-channel tokens,
stream-signal words out of bounds. It is the Python client as it was before collectived.Client
moved onto the C++ client's core (libcollectived_native.so); tests of the product's behaviour
use collectived.Client, never this."""
