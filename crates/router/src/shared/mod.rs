//! State the actors write and the request path reads without a hop: the routing view (membership,
//! the routing snapshot, the balancer), the link registry, and placement's view and mailbox.
pub mod links;
pub mod placement;
pub mod routing;

pub use links::{InflightPermit, Link, Links};
pub use placement::{Placement, PlacementView};
pub use routing::{RouteSettings, RoutingView};
