//! UCX status codes (`ucs_status_t`) and the outcome type of non-blocking operations.

use std::fmt;

macro_rules! statuses {
    ($( $(#[$m:meta])* $name:ident = $code:expr, $text:expr; )*) => {
        /// A UCX status code, with the numeric value of `ucs_status_t`.
        ///
        /// `Status::Ok` and `Status::InProgress` are not errors; every negative code is.
        /// The link-failure range (`FirstLinkFailure..=LastLinkFailure`, -40..=-59) and the
        /// endpoint-failure range (`FirstEndpointFailure..=LastEndpointFailure`, -60..=-89)
        /// are named by their bounds, as in UCX.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(i8)]
        #[non_exhaustive]
        pub enum Status {
            $( $(#[$m])* $name = $code, )*
        }

        impl Status {
            /// Every status, in declaration order.
            pub const ALL: &'static [Status] = &[$(Status::$name,)*];

            /// The `ucs_status_t` value.
            #[inline]
            pub const fn code(self) -> i8 {
                self as i8
            }

            /// The status with numeric value `code`, if UCX names one.
            pub const fn from_code(code: i8) -> Option<Status> {
                match code {
                    $( $code => Some(Status::$name), )*
                    _ => None,
                }
            }

            /// UCX's `ucs_status_string` text.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Status::$name => $text, )*
                }
            }
        }
    };
}

statuses! {
    /// `UCS_OK`
    Ok = 0, "Success";
    /// `UCS_INPROGRESS`
    InProgress = 1, "Operation in progress";
    /// `UCS_ERR_NO_MESSAGE`
    NoMessage = -1, "No pending message";
    /// `UCS_ERR_NO_RESOURCE`
    NoResource = -2, "No resources are available to initiate the operation";
    /// `UCS_ERR_IO_ERROR`
    IoError = -3, "Input/output error";
    /// `UCS_ERR_NO_MEMORY`
    NoMemory = -4, "Out of memory";
    /// `UCS_ERR_INVALID_PARAM`
    InvalidParam = -5, "Invalid parameter";
    /// `UCS_ERR_UNREACHABLE`
    Unreachable = -6, "Destination is unreachable";
    /// `UCS_ERR_INVALID_ADDR`
    InvalidAddr = -7, "Address not valid";
    /// `UCS_ERR_NOT_IMPLEMENTED`
    NotImplemented = -8, "Function not implemented";
    /// `UCS_ERR_MESSAGE_TRUNCATED`
    MessageTruncated = -9, "Message truncated";
    /// `UCS_ERR_NO_PROGRESS`
    NoProgress = -10, "No progress";
    /// `UCS_ERR_BUFFER_TOO_SMALL`
    BufferTooSmall = -11, "Provided buffer is too small";
    /// `UCS_ERR_NO_ELEM`
    NoElem = -12, "No such element";
    /// `UCS_ERR_SOME_CONNECTS_FAILED`
    SomeConnectsFailed = -13, "Failed to connect some of the requested endpoints";
    /// `UCS_ERR_NO_DEVICE`
    NoDevice = -14, "No such device";
    /// `UCS_ERR_BUSY`
    Busy = -15, "Device is busy";
    /// `UCS_ERR_CANCELED`
    Canceled = -16, "Request canceled";
    /// `UCS_ERR_SHMEM_SEGMENT`
    ShmemSegment = -17, "Shared memory error";
    /// `UCS_ERR_ALREADY_EXISTS`
    AlreadyExists = -18, "Element already exists";
    /// `UCS_ERR_OUT_OF_RANGE`
    OutOfRange = -19, "Index out of range";
    /// `UCS_ERR_TIMED_OUT`
    TimedOut = -20, "Operation timed out";
    /// `UCS_ERR_EXCEEDS_LIMIT`
    ExceedsLimit = -21, "User-defined limit was reached";
    /// `UCS_ERR_UNSUPPORTED`
    Unsupported = -22, "Unsupported operation";
    /// `UCS_ERR_REJECTED`
    Rejected = -23, "Operation rejected by remote peer";
    /// `UCS_ERR_NOT_CONNECTED`
    NotConnected = -24, "Endpoint is not connected";
    /// `UCS_ERR_CONNECTION_RESET`
    ConnectionReset = -25, "Connection reset by remote peer";
    /// `UCS_ERR_FIRST_LINK_FAILURE`: first code of the link-failure range.
    FirstLinkFailure = -40, "Link failure";
    /// `UCS_ERR_LAST_LINK_FAILURE`: last code of the link-failure range.
    LastLinkFailure = -59, "Link failure";
    /// `UCS_ERR_FIRST_ENDPOINT_FAILURE`: first code of the endpoint-failure range.
    FirstEndpointFailure = -60, "Endpoint failure";
    /// `UCS_ERR_ENDPOINT_TIMEOUT`
    EndpointTimeout = -80, "Endpoint timeout";
    /// `UCS_ERR_LAST_ENDPOINT_FAILURE`: last code of the endpoint-failure range.
    LastEndpointFailure = -89, "Endpoint failure";
    /// `UCS_ERR_LAST`: bound of all error codes.
    Last = -100, "Unknown error";
}

impl Status {
    /// True for every negative code (`UCS_STATUS_IS_ERR`).
    #[inline]
    pub const fn is_err(self) -> bool {
        self.code() < 0
    }

    /// True inside the link-failure range (`UCS_IS_LINK_ERROR`).
    pub const fn is_link_error(self) -> bool {
        let c = self.code();
        c <= Status::FirstLinkFailure.code() && c >= Status::LastLinkFailure.code()
    }

    /// True inside the endpoint-failure range (`UCS_IS_ENDPOINT_ERROR`).
    pub const fn is_endpoint_error(self) -> bool {
        let c = self.code();
        c <= Status::FirstEndpointFailure.code() && c >= Status::LastEndpointFailure.code()
    }

    /// `Ok(())` for [`Status::Ok`], `Err(self)` otherwise.
    #[inline]
    pub fn into_result(self) -> Result<(), Status> {
        if self == Status::Ok {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Status {}

impl From<std::io::Error> for Status {
    fn from(e: std::io::Error) -> Self {
        Status::from_errno(e.raw_os_error().unwrap_or(0))
    }
}

impl Status {
    /// Maps an `errno` value to the closest status, as UCX's system helpers do.
    pub fn from_errno(errno: i32) -> Status {
        match errno {
            libc::EAGAIN => Status::NoResource,
            libc::ENOMEM => Status::NoMemory,
            libc::EINVAL => Status::InvalidParam,
            libc::ENOENT | libc::ENODEV | libc::ENXIO => Status::NoDevice,
            libc::EBUSY => Status::Busy,
            libc::EEXIST => Status::AlreadyExists,
            libc::ETIMEDOUT => Status::TimedOut,
            libc::ECONNRESET | libc::EPIPE | libc::ESRCH => Status::ConnectionReset,
            libc::ECANCELED => Status::Canceled,
            libc::ENOTSUP => Status::Unsupported,
            libc::EPERM | libc::EACCES => Status::Rejected,
            libc::ERANGE => Status::OutOfRange,
            _ => Status::IoError,
        }
    }
}

/// How a non-blocking operation went, when it did not fail.
///
/// UCX returns `UCS_OK`, `UCS_INPROGRESS` or `UCS_ERR_NO_RESOURCE` from the same call; these are
/// outcomes the caller branches on, not errors, so they live here and real errors travel as
/// `Err(Status)` in [`OpResult`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "an InProgress or NoResource outcome needs handling"]
pub enum Outcome<T = ()> {
    /// Completed now (`UCS_OK`); buffers may be reused and no completion callback will fire.
    Done(T),
    /// Started (`UCS_INPROGRESS`); the completion passed with the operation fires later.
    InProgress,
    /// Nothing started (`UCS_ERR_NO_RESOURCE`); retry later, e.g. from a pending callback.
    NoResource,
}

impl<T> Outcome<T> {
    /// The UCX status this outcome corresponds to.
    #[inline]
    pub fn status(&self) -> Status {
        match self {
            Outcome::Done(_) => Status::Ok,
            Outcome::InProgress => Status::InProgress,
            Outcome::NoResource => Status::NoResource,
        }
    }

    /// True for [`Outcome::Done`].
    #[inline]
    pub fn is_done(&self) -> bool {
        matches!(self, Outcome::Done(_))
    }

    /// Maps the value of a `Done` outcome.
    #[inline]
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Done(v) => Outcome::Done(f(v)),
            Outcome::InProgress => Outcome::InProgress,
            Outcome::NoResource => Outcome::NoResource,
        }
    }
}

/// Result of a non-blocking operation: an [`Outcome`], or an error status.
///
/// Errors never carry `Ok`, `InProgress` or `NoResource`; use [`op_result`] to build one from a
/// raw status.
pub type OpResult<T = ()> = Result<Outcome<T>, Status>;

/// Result of an operation that either succeeds or fails with a status.
pub type UcsResult<T = ()> = Result<T, Status>;

/// Converts a raw UCX status into an [`OpResult`] without a value.
pub fn op_result(status: Status) -> OpResult {
    match status {
        Status::Ok => Ok(Outcome::Done(())),
        Status::InProgress => Ok(Outcome::InProgress),
        Status::NoResource => Ok(Outcome::NoResource),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_ucx() {
        assert_eq!(Status::NoResource.code(), -2);
        assert_eq!(Status::Ok.code(), 0);
        assert_eq!(Status::InProgress.code(), 1);
        assert_eq!(Status::ConnectionReset.code(), -25);
        assert_eq!(Status::FirstLinkFailure.code(), -40);
        assert_eq!(Status::LastLinkFailure.code(), -59);
        assert_eq!(Status::FirstEndpointFailure.code(), -60);
        assert_eq!(Status::EndpointTimeout.code(), -80);
        assert_eq!(Status::LastEndpointFailure.code(), -89);
        assert_eq!(Status::Last.code(), -100);
        // every code from -1 to -25 is named and contiguous
        for c in -25..=1i8 {
            assert!(Status::from_code(c).is_some(), "code {c}");
        }
        assert_eq!(Status::from_code(-26), None);
        assert_eq!(Status::from_code(-45), None);
    }

    #[test]
    fn round_trip_and_strings() {
        for &s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
            assert!(!s.to_string().is_empty());
        }
        assert_eq!(Status::NoResource.to_string(), "No resources are available to initiate the operation");
        assert_eq!(Status::EndpointTimeout.to_string(), "Endpoint timeout");
        assert!(Status::EndpointTimeout.is_endpoint_error());
        assert!(!Status::EndpointTimeout.is_link_error());
        assert!(Status::FirstLinkFailure.is_link_error());
        assert!(Status::IoError.is_err() && !Status::InProgress.is_err());
    }

    #[test]
    fn op_result_mapping() {
        assert_eq!(op_result(Status::Ok), Ok(Outcome::Done(())));
        assert_eq!(op_result(Status::InProgress), Ok(Outcome::InProgress));
        assert_eq!(op_result(Status::NoResource), Ok(Outcome::NoResource));
        assert_eq!(op_result(Status::Busy), Err(Status::Busy));
        assert_eq!(Outcome::Done(3).map(|x| x * 2), Outcome::Done(6));
    }
}
