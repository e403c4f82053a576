//! A WeChat combination is asked about only whole, through the combine endpoints, signed by
//! the combination's account (interface.md, "Asking WeChat"): one combine query per
//! combination and run, not one per sub-order; a paid answer applied by the ledger in one
//! transaction, as the combined notification would be; expiry closes the combination at
//! WeChat first, and only the signed query decides what each sub-order became.
//!
//! An Alipay combination is no such thing: each sub-order is an ordinary trade, asked about
//! and closed as any order.

use crate::channel::api::{CloseAnswer, CombineAnswer, ProviderApi};
use crate::combined::Stored;
use crate::metrics::{ExpiryResult, ProviderCall};
use crate::notice::{ChannelId, Notice, NoticeKind, Outcome};
use crate::order::OrderStatus;
use crate::store::StoreError;
use crate::store::ledger::CloseResult;

use super::{Closing, MAX_CLOSE_BACKOFF_SECS, Reconciler, Said, UNDECIDED};

/// What a signed combine query said of the combination's sub-orders.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// Sub-orders WeChat shows paid (`SUCCESS`, `REFUND`).
    paid: usize,
    /// Sub-orders WeChat shows `CLOSED` (or `REVOKED`).
    closed: usize,
    /// The rest: not paid, and still payable.
    open: usize,
}

fn seen(notice: &Notice) -> Seen {
    let mut seen = Seen::default();
    if let NoticeKind::Combined(c) = &notice.kind {
        for sub in &c.subs {
            if sub.is_paid() {
                seen.paid += 1;
            } else if matches!(sub.trade_state.as_str(), "CLOSED" | "REVOKED") {
                seen.closed += 1;
            } else {
                seen.open += 1;
            }
        }
    }
    seen
}

impl Reconciler {
    /// Whether `order` is a sub-order of a WeChat combination: its combination, read whole.
    pub async fn wechat_combination_of(
        &self,
        combine_out_trade_no: Option<&str>,
    ) -> Result<Option<Stored>, StoreError> {
        let Some(no) = combine_out_trade_no else {
            return Ok(None);
        };
        Ok(self
            .store
            .combination(no)
            .await?
            .filter(|c| c.row.channel == ChannelId::Wechat.as_str()))
    }

    fn wechat_api(&self) -> Option<&dyn ProviderApi> {
        self.apis
            .iter()
            .find(|a| a.channel() == ChannelId::Wechat)
            .map(|a| a.as_ref())
    }

    /// The combine query of `combination`, its paid sub-orders applied by the ledger in one
    /// transaction; with the signed answer's notice when there was one.
    pub async fn query_combination(
        &self,
        combination: &Stored,
    ) -> Result<(Said, Option<Notice>), StoreError> {
        let row = &combination.row;
        let no = row.combine_out_trade_no.as_str();
        let Some(api) = self.wechat_api() else {
            return Ok((self.not_asked(&row.account, "no WeChat API client"), None));
        };
        let answer = api.combine_query(&row.account, no, self.clock.now()).await;
        let detail = match &answer {
            CombineAnswer::Failed(f) => Some(f.detail().to_owned()),
            CombineAnswer::Found(n) => {
                let s = seen(n);
                Some(format!(
                    "{} paid, {} closed, {} open",
                    s.paid, s.closed, s.open
                ))
            }
            CombineAnswer::NotFound => None,
        };
        let mut said = self.said(
            api,
            &row.account,
            ProviderCall::CombineQuery,
            answer.label(),
            detail,
        );
        match answer {
            CombineAnswer::Found(notice) => {
                if seen(&notice).paid > 0 {
                    said.ledger = Some(match self.apply(&notice, self.clock.now()).await {
                        Ok(outcome) => outcome.as_str(),
                        Err(StoreError::Undecided(why)) => {
                            tracing::warn!(combine_out_trade_no = no, %why, "recovered combined payment not decided in time");
                            UNDECIDED
                        }
                        Err(e) => return Err(e),
                    });
                }
                Ok((said, Some(*notice)))
            }
            CombineAnswer::Failed(f) => {
                self.failed(no, &said, &f);
                Ok((said, None))
            }
            CombineAnswer::NotFound => Ok((said, None)),
        }
    }

    fn not_asked(&self, account: &str, why: &str) -> Said {
        Said {
            channel: ChannelId::Wechat,
            account: account.to_owned(),
            call: ProviderCall::CombineQuery.label(),
            answer: "unexpected",
            detail: Some(why.to_owned()),
            ledger: None,
        }
    }

    /// Puts off the next query (or close) of every waiting sub-order of `combination`.
    async fn combination_again_at(
        &self,
        combination: &Stored,
        wait_secs: i64,
        close_failed: bool,
    ) -> Result<(), StoreError> {
        let at = self.clock.now().plus_seconds(wait_secs);
        for (order, _) in &combination.subs {
            if order.status == OrderStatus::WaitPay {
                self.store
                    .query_again_at(&order.order_no, at, close_failed)
                    .await?;
            }
        }
        Ok(())
    }

    /// `POST /combined-orders/{combine_out_trade_no}/close`: a WeChat combination closed
    /// whole ([`Reconciler::close_combination`]); an Alipay one sub-order by sub-order, each
    /// as `POST /orders/{order_no}/close` closes an order. `Pending` when a provider could not
    /// be asked; the caller reads what the sub-orders became.
    pub async fn close_combined(&self, combination: &Stored) -> Result<Closing, StoreError> {
        let waiting = combination
            .subs
            .iter()
            .any(|(o, _)| o.status == OrderStatus::WaitPay);
        let paid = combination
            .subs
            .iter()
            .any(|(o, _)| matches!(o.status, OrderStatus::Paid | OrderStatus::Refunded));
        if !waiting || paid {
            return Ok(Closing::Done(CloseResult::NotFound));
        }
        let mut said = Vec::new();
        if combination.row.channel == ChannelId::Wechat.as_str() {
            return self
                .close_combination(combination, "api", false, 0, &mut said)
                .await;
        }
        let mut pending = false;
        for (order, _) in &combination.subs {
            if let Some(target) = self.store.reconcile_target(&order.order_no).await?
                && target.status == OrderStatus::WaitPay
                && let Closing::Pending = self.close(&target, "api", false, &mut said).await?
            {
                pending = true;
            }
        }
        Ok(if pending {
            Closing::Pending
        } else {
            Closing::Done(CloseResult::NotFound)
        })
    }

    /// The reconcile job's turn for a combination: one combine query, and the next one not
    /// before `every_secs` for every sub-order.
    pub(super) async fn reconcile_combination(
        &self,
        combination: &Stored,
    ) -> Result<bool, StoreError> {
        self.combination_again_at(combination, self.every_secs, false)
            .await?;
        let (said, _) = self.query_combination(combination).await?;
        Ok(said.ledger == Some(Outcome::Applied.as_str()))
    }

    /// Closes `combination` whole at WeChat, then here: the combine query first (a paid
    /// combination is applied, not closed; its answer names the `combine_appid` the close
    /// must carry), the combine close listing every sub-order as recorded, then the combine
    /// query again, which alone decides. Each sub-order it shows `CLOSED` is closed here with
    /// its `ORDER_CLOSED`; one shown paid has its payment applied. A WeChat that cannot be
    /// asked, or has no such combination, leaves it waiting as an ordinary order would be,
    /// and with `grace` it closes here `close_grace_secs` past `expire_at`.
    pub async fn close_combination(
        &self,
        combination: &Stored,
        by: &str,
        grace: bool,
        attempts: i32,
        said: &mut Vec<Said>,
    ) -> Result<Closing, StoreError> {
        let row = &combination.row;
        let no = row.combine_out_trade_no.as_str();
        let (first, notice) = self.query_combination(combination).await?;
        let mut answered = first.answer;
        let mut paying = first.ledger == Some(UNDECIDED);
        said.push(first);
        let mut state = notice.as_ref().map(seen);
        if let (Some(api), Some(notice), Some(s)) = (self.wechat_api(), &notice, state)
            && s.paid == 0
            && s.open > 0
        {
            let appid = notice.merchant.app_id.clone().unwrap_or_default();
            let subs: Vec<(String, String)> = combination
                .subs
                .iter()
                .map(|(o, account)| {
                    (
                        account.clone().unwrap_or_else(|| row.account.clone()),
                        o.order_no.clone(),
                    )
                })
                .collect();
            let answer = api
                .combine_close(&row.account, no, &appid, &subs, self.clock.now())
                .await;
            let detail = match &answer {
                CloseAnswer::Failed(f) => Some(f.detail().to_owned()),
                _ => None,
            };
            let closed = self.said(
                api,
                &row.account,
                ProviderCall::CombineClose,
                answer.label(),
                detail,
            );
            if let CloseAnswer::Failed(f) = &answer {
                self.failed(no, &closed, f);
            }
            said.push(closed);
            if !matches!(answer, CloseAnswer::Failed(_)) {
                let (again, notice) = self.query_combination(combination).await?;
                answered = again.answer;
                paying |= again.ledger == Some(UNDECIDED);
                state = notice.as_ref().map(seen);
                said.push(again);
            } else {
                state = None;
                answered = "unreachable";
            }
        }
        let now = self.clock.now();
        if paying {
            self.combination_again_at(combination, 10, true).await?;
            if grace {
                self.metrics.expired(ExpiryResult::Retried);
            }
            return Ok(Closing::Pending);
        }
        if let (Some(s), Some(notice)) = (state, &notice)
            && s.paid > 0
        {
            // Paid at WeChat (every sub-order or none): applied above, never closed.
            let paid_no = match &notice.kind {
                NoticeKind::Combined(c) => c
                    .subs
                    .iter()
                    .find(|sub| sub.is_paid())
                    .map(|sub| sub.out_trade_no.clone()),
                _ => None,
            }
            .unwrap_or_default();
            let result = self.store.close_order(&paid_no, by, now).await?;
            if grace {
                self.metrics.expired(ExpiryResult::Paid);
            }
            return Ok(Closing::Done(result));
        }
        // Every sub-order WeChat shows is closed: closed here too.
        let shown_closed = state.is_some_and(|s| s.closed > 0 && s.open == 0);
        let absent = answered == "not_found";
        let unanswered = !shown_closed && !absent;
        if !shown_closed {
            let deadline = row.expire_at.plus_seconds(self.close_grace_secs);
            let past = now.unix_seconds() >= deadline.unix_seconds();
            if !(past && (grace || !unanswered)) {
                let attempts = u32::try_from(attempts.clamp(0, 6)).unwrap_or(6);
                let wait = (10_i64 << attempts).min(MAX_CLOSE_BACKOFF_SECS);
                self.combination_again_at(combination, wait, true).await?;
                if grace {
                    self.metrics.expired(ExpiryResult::Retried);
                }
                return Ok(Closing::Pending);
            }
            tracing::warn!(
                combine_out_trade_no = no,
                "combination closed here without WeChat's word that it is closed, reconcile.close_grace_secs past expire_at; a payment that still lands becomes a PAID_AFTER_CLOSE anomaly"
            );
        }
        let mut result = CloseResult::NotFound;
        let mut closed_any = false;
        for (order, _) in &combination.subs {
            let one = self.store.close_order(&order.order_no, by, now).await?;
            closed_any |= matches!(one, CloseResult::Closed(_));
            if !matches!(result, CloseResult::NotClosable(_) | CloseResult::Closed(_)) {
                result = one;
            }
        }
        if grace && closed_any {
            self.metrics.expired(if shown_closed {
                ExpiryResult::ClosedAtProvider
            } else if absent {
                ExpiryResult::ClosedNotFound
            } else {
                ExpiryResult::ClosedAfterGrace
            });
        }
        Ok(Closing::Done(result))
    }
}

#[cfg(test)]
mod tests {
    use super::seen;
    use crate::notice::{ChannelId, Combination, MerchantIds, Notice, NoticeKind, SubPayment};

    #[test]
    fn a_query_answer_is_counted_by_sub_order_state() {
        let sub = |state: &str| SubPayment {
            out_trade_no: state.to_owned(),
            transaction_id: String::new(),
            amount_fen: 1,
            currency: "CNY".into(),
            mchid: "m".into(),
            trade_state: state.to_owned(),
            occurred_at: None,
        };
        let notice = Notice {
            channel: ChannelId::Wechat,
            kind: NoticeKind::Combined(Box::new(Combination {
                subs: ["SUCCESS", "REFUND", "CLOSED", "NOTPAY", "USERPAYING"]
                    .into_iter()
                    .map(sub)
                    .collect(),
            })),
            out_trade_no: "C".into(),
            transaction_id: String::new(),
            amount_fen: 5,
            currency: "CNY".into(),
            merchant: MerchantIds {
                merchant_id: "m".into(),
                app_id: None,
            },
            merchant_matches: true,
            occurred_at: None,
        };
        let s = seen(&notice);
        assert_eq!((s.paid, s.closed, s.open), (2, 1, 2));
    }
}
