// Keeps a connection reset by its peer from terminating the sidecar inside Gloo.
//
// Gloo 0.5.0 (Debian's libgloo) reads a newly connected pair's peer address with getpeername()
// on its own event-loop thread and throws gloo::EnforceNotMet when that fails. A connection
// reset before that moment (a peer sidecar that gave up on a group being formed, or anything on
// the network connecting and resetting) makes getpeername fail with ENOTCONN, and the exception,
// thrown on a thread nobody can catch it on, calls std::terminate: every trainer of the node loses
// its sidecar. This translation unit interposes getpeername() for the calls libgloo makes (only
// those): ENOTCONN is answered with an unspecified IPv4 address, so Gloo carries on with the dead
// socket, whose next read fails as an ordinary pair error that reaches the rendezvous or the op.
#pragma once

namespace collectived {

// Referenced by the Gloo connector so that the interposer is linked into every program that can
// open Gloo connections. Does nothing at run time.
void LinkGlooPeerNameGuard();

}  // namespace collectived
