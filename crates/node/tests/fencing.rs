//! A real mesh-node refuses placement commands from a deposed leader: after a router announces
//! epoch 7, commands stamped with an older epoch are answered as fenced or ignored, and the node
//! keeps serving.
mod common;

use std::time::Duration;

use common::*;
use mesh::cluster::msg::{Evict, Fence, Message, Place};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_an_older_epoch_are_refused() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-f", router.addr).await;
    let mut link = router.accept_hello().await;
    link.welcome().await;
    send(&mut link.control, &Message::Fence(Fence { epoch: 7 })).await;
    node.wait_log("this router leads placement now", Duration::from_secs(30))
        .await;

    let place = |epoch| {
        Message::Place(Place {
            model: "elsewhere".into(),
            key: "k".into(),
            files: Vec::new(),
            config: String::new(),
            epoch,
        })
    };
    send(&mut link.control, &place(3)).await;
    let placed = loop {
        match link.next_control(Duration::from_secs(30)).await {
            Message::Placed(p) => break p,
            Message::LoadReport(_) | Message::ModelEvent(_) => continue,
            other => panic!("expected the place answered, got {other:?}"),
        }
    };
    assert_eq!(placed.model, "elsewhere");
    assert!(
        placed.error.contains("fenced") && placed.error.contains("epoch 7"),
        "{}",
        placed.error
    );
    // An eviction at an old epoch is not carried out either.
    send(
        &mut link.control,
        &Message::Evict(Evict {
            model: "add_sub".into(),
            epoch: 6,
        }),
    )
    .await;
    node.wait_log("the command carries placement epoch 6", Duration::from_secs(30))
        .await;
    node.assert_serving().await;
    assert!(
        link.conn.close_reason().is_none(),
        "a fenced command does not end the link"
    );
}
